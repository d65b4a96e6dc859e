"""A node's ranks as a job its node doctor's supervisor can watch
(``python -m nccl_doctor.supervisor.node_ranks END_FILE KEEPER_PID``): the cluster started those
ranks (Ray's raylet, Slurm's slurmstepd), not this process, so it only stands for them. It ends
(exit 0) when END_FILE appears (the leader's job ended) or the node doctor's keeper is gone (a
Ray actor, a Slurm task: the ranks are left alone), and at once when the supervisor stops it
(SIGTERM: a hang under ``--on-hang kill``). The ranks themselves are the supervisor's to stop: its ``Job`` adopts every rank its
captures name (pid and start time) and signals them with the job (supervisor/launch.py)."""

from __future__ import annotations

import os
import signal
import sys
import time
from pathlib import Path


def main(argv: list[str]) -> int:
    from nccl_doctor.processes import started

    end, actor = Path(argv[0]), int(argv[1])
    actor_started = started(actor)
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda signum, _frame: os._exit(128 + signum))

    def doctor_alive() -> bool:  # the same process (its start time), not a later one of its pid
        return actor_started is not None and started(actor) == actor_started

    while not end.exists() and doctor_alive():
        time.sleep(0.2)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
