"""A Ray node's ranks as a job its node doctor's supervisor can watch
(``python -m nccl_doctor.supervisor.ray.node_ranks OUT END_FILE ACTOR_PID``): Ray's raylet
started those ranks, not this process, so it only stands for them. It ends (exit 0) when
END_FILE appears (the driver's job ended) or its node doctor's actor is gone (the doctor's
keeper ended: the ranks are left alone), and, when the supervisor stops it (SIGTERM: a hang
under ``--on-hang kill``), stops the node's ranks first: the processes whose captures OUT holds,
each checked to be the same process that wrote it (its start time) and never the doctor's
own."""

from __future__ import annotations

import os
import signal
import sys
import time
from pathlib import Path

#: Seconds a rank asked to stop has before it is killed.
GRACE = 5.0


def rank_pids(out: Path) -> list[int]:
    from nccl_doctor.capture.names import capture_files
    from nccl_doctor.capture.reader import read_counters
    from nccl_doctor.processes import started

    pids = []
    for path in capture_files(out):
        try:
            meta = read_counters(path)[0]
            pid, when = int(meta["pid"]), float(meta["started_ns"]) / 1e9
        except Exception:  # noqa: BLE001 - a damaged capture names no process to stop
            continue
        created = started(pid)  # the process that wrote it, not a later one of that pid
        if pid > 0 and pid != os.getpid() and created is not None and created <= when + 1:
            pids.append(pid)
    return pids


def stop_ranks(out: Path) -> None:
    pids = rank_pids(out)
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for pid in pids:
            try:
                os.kill(pid, sig)
            except OSError:
                pass
        deadline = time.time() + GRACE
        while sig == signal.SIGTERM and time.time() < deadline and any(
                _alive(p) for p in pids):
            time.sleep(0.1)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
        return True
    except OSError:
        return False


def main(argv: list[str]) -> int:
    from nccl_doctor.processes import started

    out, end, actor = Path(argv[0]), Path(argv[1]), int(argv[2])
    actor_started = started(actor)

    def stopped(signum: int, _frame: object) -> None:
        stop_ranks(out)
        os._exit(128 + signum)

    signal.signal(signal.SIGTERM, stopped)
    signal.signal(signal.SIGINT, stopped)

    def doctor_alive() -> bool:  # the same process (its start time), not a later one of its pid
        return actor_started is not None and started(actor) == actor_started

    while not end.exists() and doctor_alive():
        time.sleep(0.2)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
