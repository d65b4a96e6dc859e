"""Fault tests: real processes, real signals, bad paths - what a user's scheduler and terminal
do to a run (issue "Reliability and security"). Each test fails on a doctor without the fix."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

from nccl_doctor.testing.spawn import command as spawn_command

CLI = [sys.executable, "-m", "nccl_doctor"]
JOBS = Path(__file__).parent.parent / "integration" / "jobs"


def doctor(*args: str, timeout: float = 240, **kwargs) -> subprocess.CompletedProcess:
    return subprocess.run([*CLI, *args], capture_output=True, text=True, timeout=timeout, **kwargs)


def torchrun(nproc: int, script: Path | str, *args: str) -> list[str]:
    """torchrun's command: for the tests whose subject is the launcher (its signals, its
    sessions, its restarts, its own output)."""
    return [sys.executable, "-m", "torch.distributed.run", "--standalone",
            f"--nproc-per-node={nproc}", str(script), *args]


def spawn(nproc: int, script: Path | str, *args: str) -> list[str]:
    """The command starting ``nproc`` ranks of ``script`` as torchrun would, forked by this test
    process's fork server (nccl_doctor/testing/spawn.py): for the rest, a job whose launcher is
    not what the test is about (about 4 s of CPU less than torchrun's on 2 cores)."""
    return spawn_command(nproc, [str(script), *args])


def rank_pids(out: Path) -> list[int]:
    """The ranks' pids, from their capture files' names (rankNNNNN.HOST.PID.ndcap)."""
    return [int(p.name.split(".")[-2]) for p in out.glob("rank*.ndcap")]


def wait_for(predicate, timeout: float, every: float = 0.2) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(every)
    return predicate()


def alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(") ")[-1].split()[0] != "Z"
    except OSError:
        return False


__all__ = ["CLI", "JOBS", "doctor", "torchrun", "spawn", "rank_pids", "wait_for", "alive", "os"]
