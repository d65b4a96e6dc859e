"""Simulated nodes: ``--nnodes N`` torchrun agents on localhost, one per node, as a multi-node job
launches (each agent sets GROUP_RANK/NODE_RANK for its ranks). Waits for all of them; exits with
the first non-zero status, and stops the others when one fails or on Ctrl-C.

    python -m nccl_doctor.reproducers.nodes --nnodes 2 --nproc-per-node 2 -m MODULE [ARGS...]
"""

from __future__ import annotations

import argparse
import signal
import socket
import subprocess
import sys
import time


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    # everything after "-m MODULE" belongs to the module, "--flags" included
    split = argv.index("-m") + 2 if "-m" in argv else len(argv)
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--nnodes", type=int, default=2)
    p.add_argument("--nproc-per-node", type=int, default=2)
    p.add_argument("-m", dest="module", required=True)
    a = p.parse_args(argv[:split])
    a.args = argv[split:]
    port = free_port()
    agents = [subprocess.Popen([
        sys.executable, "-m", "torch.distributed.run", f"--nnodes={a.nnodes}",
        f"--nproc-per-node={a.nproc_per_node}", f"--node-rank={node}",
        "--master-addr=127.0.0.1", f"--master-port={port}", "-m", a.module, *a.args,
    ]) for node in range(a.nnodes)]

    def stop(*_: object) -> None:
        for agent in agents:
            if agent.poll() is None:
                agent.terminate()

    signal.signal(signal.SIGTERM, lambda *_: stop())
    status = 0
    try:
        while any(agent.poll() is None for agent in agents):
            failed = [agent.returncode for agent in agents if agent.returncode]
            if failed and not status:
                status = failed[0]
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
