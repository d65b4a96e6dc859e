"""Simulated nodes: ``--nnodes N`` torchrun agents on localhost, one per node, as a multi-node job
launches (each agent sets GROUP_RANK/NODE_RANK for its ranks). Waits for all of them; exits with
the first non-zero status, and stops the others when one fails or on Ctrl-C.

    python -m nccl_doctor.reproducers.nodes --nnodes 2 --nproc-per-node 2 -m MODULE [ARGS...]

``--doctor DIR`` runs each node as a real multi-node user would: its own ``nccl-doctor run
--out DIR/HOST`` around its own agent, each on its own simulated host - a UTS namespace
(``unshare -u``, root only) whose hostname is ``--hosts``'s (default node0, node1, ...). Where
namespaces are refused it says so on stderr and names the hosts through NCCL_DOCTOR_HOSTNAME
instead. ``--doctor-args "..."`` adds options to every ``nccl-doctor run``. Each node's
supervisor pid is printed as ``node I host H pid P`` (stderr) as it starts.

``-m MODULE`` runs a module on every rank; ``--script PATH`` a file.
"""

from __future__ import annotations

import argparse
import os
import shlex
import signal
import socket
import subprocess
import sys
import time


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def namespaces_work() -> tuple[bool, str]:
    """Whether this process may create UTS namespaces (``unshare -u``), and why not."""
    try:
        proc = subprocess.run(["unshare", "-u", "true"], capture_output=True, text=True,
                              timeout=10)
    except (OSError, subprocess.TimeoutExpired) as err:
        return False, str(err)
    return proc.returncode == 0, proc.stderr.strip()


def node_command(node: int, nnodes: int, nproc: int, port: int, target: list[str],
                 doctor: str | None, host: str, doctor_args: list[str],
                 uts: bool) -> tuple[list[str], dict[str, str]]:
    """One node's command line and environment additions."""
    agent = [sys.executable, "-m", "torch.distributed.run", f"--nnodes={nnodes}",
             f"--nproc-per-node={nproc}", f"--node-rank={node}", "--master-addr=127.0.0.1",
             f"--master-port={port}", *target]
    if doctor is None:
        return agent, {}
    run = [sys.executable, "-m", "nccl_doctor", "run", "--out", os.path.join(doctor, host),
           *doctor_args, "--", *agent]
    if uts:
        return ["unshare", "-u", "sh", "-c", 'hostname "$0" && exec "$@"', host, *run], {}
    return run, {"NCCL_DOCTOR_HOSTNAME": host}


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    # everything after "-m MODULE" / "--script PATH" belongs to it, "--flags" included
    cut = next((i + 2 for i, a in enumerate(argv) if a in ("-m", "--script")), len(argv))
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--nnodes", type=int, default=2)
    p.add_argument("--nproc-per-node", type=int, default=2)
    p.add_argument("--doctor", default=None, metavar="DIR",
                   help="each node under its own `nccl-doctor run --out DIR/HOST`")
    p.add_argument("--hosts", default=None, help="comma-separated host names, one per node")
    p.add_argument("--doctor-args", default="", help="more options for every nccl-doctor run")
    p.add_argument("--master-port", type=int, default=None,
                   help="the job's rendezvous port (default: a free one)")
    target = p.add_mutually_exclusive_group(required=True)
    target.add_argument("-m", dest="module")
    target.add_argument("--script")
    a = p.parse_args(argv[:cut])
    rest = argv[cut:]
    hosts = a.hosts.split(",") if a.hosts else [f"node{i}" for i in range(a.nnodes)]
    if len(hosts) != a.nnodes:
        p.error(f"--hosts names {len(hosts)} hosts for {a.nnodes} nodes")
    uts = False
    if a.doctor is not None:
        uts, why = namespaces_work()
        if not uts:
            print(f"nodes: UTS namespaces refused ({why or 'unshare failed'}): hosts are "
                  "simulated with NCCL_DOCTOR_HOSTNAME", file=sys.stderr, flush=True)
    port = a.master_port or free_port()
    what = ["-m", a.module, *rest] if a.module else [a.script, *rest]
    agents = []
    for node in range(a.nnodes):
        cmd, extra = node_command(node, a.nnodes, a.nproc_per_node, port, what, a.doctor,
                                  hosts[node], shlex.split(a.doctor_args), uts)
        agents.append(subprocess.Popen(cmd, env={**os.environ, **extra}))
        if a.doctor is not None:
            print(f"node {node} host {hosts[node]} pid {agents[-1].pid}", file=sys.stderr,
                  flush=True)

    def stop(*_: object) -> None:
        for agent in agents:
            if agent.poll() is None:
                agent.terminate()

    signal.signal(signal.SIGTERM, lambda *_: stop())
    status = 0
    try:
        while any(agent.poll() is None for agent in agents):
            failed = [agent.returncode for agent in agents if agent.returncode]
            if failed and not status and a.doctor is None:
                status = failed[0]  # under the doctor, each node's supervisor ends its node
                stop()
            time.sleep(0.2)
    except KeyboardInterrupt:
        stop()
    for agent in agents:
        agent.wait()
        status = status or agent.returncode
    return status


if __name__ == "__main__":
    raise SystemExit(main())
