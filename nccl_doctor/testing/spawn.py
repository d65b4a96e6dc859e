"""A launcher as small as ``srun`` or ``mpirun`` on one node, for the pytest plugin's distributed
tests (and the suite's jobs whose subject is not the launcher): it starts ``--nproc`` ranks of a
script (or ``-m module``) with torch's environment contract (MASTER_ADDR/MASTER_PORT on a free loopback port, RANK, LOCAL_RANK, WORLD_SIZE,
LOCAL_WORLD_SIZE, GROUP_RANK, OMP_NUM_THREADS=1), waits for them, and ends as torchrun does:
the first rank to fail stops the others (SIGTERM, then SIGKILL after a grace period) and the
launcher exits 1 (torchrun's status for a failed worker); SIGTERM or SIGINT to the launcher goes
to every rank.

It imports no torch: a job under it costs one torch start-up less than under torchrun (about a
third of the CPU of a small 2-rank job on a 2-core machine), and nothing of torchrun's elastic
agent is needed to run a test's ranks once.

    python -m nccl_doctor.testing.spawn --nproc 2 job.py [ARGS...]
    python -m nccl_doctor.testing.spawn --nproc 2 -m package.module [ARGS...]

MASTER_PORT is a port the kernel just handed out and released (as torch's own tests pick one):
another process may take it before rank 0 binds it, rarely enough on one machine.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time

GRACE = 10.0  # seconds between SIGTERM and SIGKILL, as torchrun's


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main(argv: list[str]) -> int:
    if len(argv) < 3 or argv[0] != "--nproc":
        print("usage: python -m nccl_doctor.testing.spawn --nproc N (SCRIPT | -m MODULE) [ARGS...]", file=sys.stderr)
        return 2
    nproc, target = int(argv[1]), argv[2:]
    base = dict(os.environ, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()),
                WORLD_SIZE=str(nproc), LOCAL_WORLD_SIZE=str(nproc), GROUP_RANK="0")
    base.setdefault("OMP_NUM_THREADS", "1")
    ranks = [subprocess.Popen([sys.executable, *target],
                              env=dict(base, RANK=str(r), LOCAL_RANK=str(r)))
             for r in range(nproc)]

    def stop(sig: int, _frame: object = None) -> None:
        for p in ranks:
            if p.poll() is None:
                try:
                    p.send_signal(sig)
                except ProcessLookupError:
                    pass

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    failed: int | None = None
    while [p.poll() for p in ranks].count(None):  # (every rank polled: its status is set)
        if failed is None:
            failed = next((p.returncode for p in ranks if p.returncode not in (None, 0)), None)
            if failed is not None:
                stop(signal.SIGTERM)
                deadline = time.monotonic() + GRACE
        elif time.monotonic() > deadline:
            stop(signal.SIGKILL)
        time.sleep(0.05)
    return 0 if failed is None and all(p.returncode == 0 for p in ranks) else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
