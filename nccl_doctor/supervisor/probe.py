"""Looking at a running job from outside: its ranks' captures and processes. Reads only."""

from __future__ import annotations

from nccl_doctor.env import host_name
from dataclasses import dataclass
from pathlib import Path

import psutil

from nccl_doctor.capture.names import capture_files
from nccl_doctor.capture.reader import read_counters
from nccl_doctor.errors import DoctorError
from nccl_doctor.analysis.calls.situation import ProcState


@dataclass(frozen=True)
class RankProcess:
    """A rank as the registry knows it: from its capture's header."""

    rank: int
    pid: int
    host: str
    local_rank: int | None
    path: Path
    started_ns: int


class Registry:
    """The job's ranks and their progress counters, from the capture directory (cheap to poll)."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.ranks: dict[int, RankProcess] = {}
        self.notes: dict[int, int] = {}  # rank -> bytes of notes written (moves with each note)
        self._known: dict[Path, RankProcess | None] = {}

    def poll(self) -> dict[int, int]:
        """rank -> records started so far. New capture files join the registry."""
        counts: dict[int, int] = {}
        for path in capture_files(self.directory):
            try:
                meta, started, notes = read_counters(path)
            except DoctorError:
                continue  # being created, or damaged: the full read will say which
            known = self._known.get(path)
            if known is None:
                known = self._known[path] = _rank_process(meta, path)
                if known is not None:
                    current = self.ranks.get(known.rank)
                    if current is None or current.started_ns <= known.started_ns:
                        self.ranks[known.rank] = known  # a restarted rank replaces the old one
            if known is not None and self.ranks.get(known.rank) is known:
                counts[known.rank] = started
                self.notes[known.rank] = notes
        return counts

    def local(self) -> dict[int, RankProcess]:
        """The ranks running on this host (the only ones this supervisor can sample)."""
        host = host_name()
        return {r: p for r, p in self.ranks.items() if p.host == host}


def _rank_process(meta: dict, path: Path) -> RankProcess | None:
    try:
        return RankProcess(
            rank=int(meta["rank"]), pid=int(meta.get("pid", 0)), host=str(meta.get("host", "")),
            local_rank=meta.get("local_rank") if isinstance(meta.get("local_rank"), int) else None,
            path=path, started_ns=int(meta.get("started_ns", 0)),
        )
    except (KeyError, TypeError, ValueError):
        return None


def proc_state(pid: int) -> ProcState:
    """One look at a process. A pid on another host reads as not alive: the watchdog only
    samples ranks on its own host (multi-node jobs need a supervisor per node)."""
    try:
        p = psutil.Process(pid)
        with p.oneshot():
            status = p.status()
            times = p.cpu_times()
        if status in (psutil.STATUS_ZOMBIE, psutil.STATUS_DEAD):
            return ProcState(pid, False, status, times.user + times.system)
        return ProcState(pid, True, status, times.user + times.system)
    except (psutil.NoSuchProcess, psutil.ZombieProcess):
        return ProcState(pid, False, "gone")
    except psutil.AccessDenied:
        return ProcState(pid, True, "unknown")
