"""One node's doctor in a Slurm allocation (``python -m nccl_doctor.supervisor.slurm.node_main``),
a task of the overlapping step the leader's supervisor launched (slurm/fleet.py). It runs
``nccl-doctor run`` on its node as a follower of the leader's coordinator, around ``node_ranks``
(the node's ranks, which the job's own step started there, as a job), and says on stdout, one
JSON object a line, what happened: ``{"host": H, "node": H, "node_rank": K}`` once its doctor
holds the node's directory (the leader's job starts after), ``{"host": H, "skip": H}`` on the
leader's own node, ``{"host": H, "error": TEXT, "gone": H}`` when its doctor ended early,
``{"gone": H}`` when it ended. Standard input's end (the leader's job ended) ends the node's job;
its doctor then takes the leader's final report and exits, and so does this task."""

from __future__ import annotations

import argparse
import json
import os
import select
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from nccl_doctor.supervisor.cluster import early_end
from nccl_doctor.supervisor.slurm.fleet import READY_WITHIN


def _fresh(path: Path, since: float) -> bool:
    """Whether ``path`` was written since ``since`` (an earlier run's manifest is not)."""
    try:
        return path.stat().st_mtime >= since - 1.0
    except OSError:
        return False


def say(record: dict[str, Any]) -> None:
    sys.stdout.write(json.dumps(record) + "\n")
    sys.stdout.flush()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="nccl_doctor.supervisor.slurm.node_main")
    p.add_argument("--leader-host", required=True)
    p.add_argument("--port", type=int, required=True, help="the coordinator's port")
    p.add_argument("--out", required=True, help="the leader's capture directory")
    p.add_argument("--node-offset", type=int, default=0,
                   help="1 when the leader runs outside the allocation (its node is 0)")
    p.add_argument("--wait", type=float, default=300.0, help="for the doctor's report")
    p.add_argument("follower", nargs=argparse.REMAINDER, help="options of the doctor's run")
    args = p.parse_args(argv)
    follower = args.follower[1:] if args.follower[:1] == ["--"] else args.follower
    from nccl_doctor import env
    from nccl_doctor.capture.names import node_dir

    host = env.host_name()
    if host == args.leader_host:  # the leader's own node: it reads it itself
        say({"host": host, "skip": host})
        return 0  # (the step runs with --wait=0: the other tasks are not ended for it)
    node_rank = int(os.environ.get("SLURM_NODEID", "0")) + args.node_offset
    # srun's host: where the leader runs (Slurm's own word for it in every task)
    address = os.environ.get("SLURM_LAUNCH_NODE_IPADDR") or args.leader_host
    out = node_dir(Path(args.out), host)
    scratch = tempfile.mkdtemp(prefix="nccl-doctor-slurm-")
    end = os.path.join(scratch, "end")
    child = {k: v for k, v in os.environ.items() if k not in (env.CAPTURE_DIR, env.LEADER_HOST)}
    command = [sys.executable, "-m", "nccl_doctor", "run", "--out", str(out), "--force",
               *follower, "--coordinator", f"{address}:{args.port}", "--node-rank",
               str(node_rank), "--", sys.executable, "-m", "nccl_doctor.supervisor.node_ranks",
               end, str(os.getpid())]
    started = time.time()
    try:
        doctor = subprocess.Popen(command, env=child, stdin=subprocess.DEVNULL)
    except OSError as err:
        say({"host": host, "error": f"no node doctor on {host} ({err.strerror})", "gone": host})
        return 1
    try:
        return _keep(doctor, out, host, node_rank, end, args.wait, started)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def _keep(doctor: subprocess.Popen, out: Path, host: str, node_rank: int, end: str,
          wait: float, started: float) -> int:
    # up: its supervisor wrote this run's manifest (the directory is its own; --force cleared an
    # earlier run's files, that run's manifest among them, before the ranks write there)
    deadline = time.monotonic() + READY_WITHIN
    while (doctor.poll() is None and not _fresh(out / "manifest.json", started)
           and time.monotonic() < deadline):
        time.sleep(0.05)
    if doctor.poll() is not None:
        say({"host": host, "error": early_end(host, doctor.returncode), "gone": host})
        return 1
    say({"host": host, "node": host, "node_rank": node_rank, "pid": doctor.pid})
    stdin_open = True
    while doctor.poll() is None:
        if not stdin_open:
            time.sleep(0.2)
            continue
        try:
            ready = select.select([sys.stdin], [], [], 0.5)[0]
            if ready and not sys.stdin.readline():
                break  # the leader's job ended (or the leader is gone)
        except (OSError, ValueError):
            stdin_open = False
    try:
        with open(end, "w"):
            pass
    except OSError:
        doctor.terminate()
    try:
        doctor.wait(wait)
    except subprocess.TimeoutExpired:  # out of time: stopped, never left behind
        doctor.kill()
        doctor.wait()
    say({"gone": host})
    return 0


if __name__ == "__main__":
    sys.exit(main())
