"""Running one tool as a child for a benchmark: its wall time (process start included) and
peak memory, killed - the whole process group - past a timeout or a memory limit.

Shared by fr_replay.py and replay_scale.py, so both report time and memory the same way.
"""

from __future__ import annotations

import os
import signal
import subprocess
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import psutil


@dataclass
class Run:
    seconds: float
    rc: int | None  # None: killed (``killed`` says why)
    peak_mib: float  # the largest process of the tree (wait4)
    tree_mib: float  # the whole tree, sampled every 0.1 s
    output: str  # stdout + stderr
    killed: str = ""  # "timeout" or "memory"

    @property
    def ok(self) -> bool:
        return self.rc == 0

    def last_line(self) -> str:
        lines = [ln for ln in self.output.splitlines() if ln.strip()]
        return lines[-1] if lines else ""

    def state(self) -> str:
        if self.killed == "timeout":
            return f"TIMED OUT (killed after {self.seconds:.1f} s: a lower bound)"
        if self.killed == "memory":
            return (f"KILLED at the memory limit after {self.seconds:.1f} s (time and memory "
                    "are lower bounds)")
        if self.rc != 0:
            return f"FAILED exit {self.rc}: {self.last_line()[:200]}"
        return "ok"


def tree_rss(pid: int) -> int:
    """Resident bytes of ``pid`` and its descendants (0 once it is gone)."""
    try:
        root = psutil.Process(pid)
        members = [root] + root.children(recursive=True)
    except psutil.Error:
        return 0
    total = 0
    for p in members:
        try:
            total += p.memory_info().rss
        except psutil.Error:
            pass
    return total


def timed(command: list[str], timeout: float | None, log: Path,
          memory_limit: float | None = None) -> Run:
    """Wall time and peak memory of one child and its descendants, killed (the whole process
    group) past ``timeout`` seconds or once they hold more than ``memory_limit`` bytes."""
    with open(log, "wb") as out:
        t0 = time.perf_counter()
        child = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT,
                                 start_new_session=True)
        result: dict = {}

        def reap() -> None:  # os.wait4 gives the child's own rusage
            _, status, usage = os.wait4(child.pid, 0)
            result["seconds"] = time.perf_counter() - t0
            result["status"], result["usage"] = status, usage

        waiter = threading.Thread(target=reap, daemon=True)
        waiter.start()
        peak, killed = 0, ""
        while waiter.is_alive():
            peak = max(peak, tree_rss(child.pid))
            if memory_limit is not None and peak > memory_limit:
                killed = "memory"
            elif timeout is not None and time.perf_counter() - t0 > timeout:
                killed = "timeout"
            if killed:
                try:
                    os.killpg(child.pid, signal.SIGKILL)
                except ProcessLookupError:  # it ended meanwhile
                    killed = ""
                break
            waiter.join(0.1)
        waiter.join()
        child.returncode = os.waitstatus_to_exitcode(result["status"])  # reaped: keep Popen quiet
    largest = result["usage"].ru_maxrss / 1024
    return Run(seconds=result["seconds"], rc=None if killed else child.returncode,
               peak_mib=largest, tree_mib=max(peak / (1 << 20), largest),
               output=log.read_text(errors="replace"), killed=killed)
