"""Looking at a running job from outside: its ranks' captures and processes. Reads only."""

from __future__ import annotations

import mmap
import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import psutil

from nccl_doctor.capture import format as fmt
from nccl_doctor.capture import joining
from nccl_doctor.env import attempt_of, host_name, own_launch
from nccl_doctor.capture.names import FolderChanges, capture_files
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
    attempt: tuple[int, int] = (0, 0)  # which launch of the job (env.attempt_of)


class Registry:
    """The job's ranks and their progress counters, from the capture directory (cheap to poll).

    A poll costs what changed: the folder is listed again only when it changed (a rank's capture
    created, a restarted rank's new one: capture/names.py ``FolderChanges``); a capture's header
    is read whole once, when it first can be, and then kept mapped, so that its two counters
    are read from memory, with no system call. ``clock``: the wall clock (``time.time``)."""

    def __init__(self, directory: Path, clock: Callable[[], float] = time.time) -> None:
        self.directory = directory
        self.ranks: dict[int, RankProcess] = {}
        self.notes: dict[int, int] = {}  # rank -> bytes of notes written (moves with each note)
        self._known: dict[Path, RankProcess | None] = {}  # (None: a capture with no usable rank)
        self._maps: dict[Path, mmap.mmap] = {}  # each known capture's header, mapped
        self._paths: list[Path] = []
        # a Slurm requeue's own launch (its supervisor's environment says which): an earlier
        # launch's captures left in the directory are never this one's ranks
        self._marker_attempts: set[tuple[int, int]] = {own_launch()}
        self.attempt: tuple[int, int] = (0, 0)  # the latest launch attempt seen
        self._folder = FolderChanges(directory, clock=clock)

    def poll(self) -> dict[int, int]:
        """rank -> records started so far. New capture files join the registry."""
        self._list()
        counts: dict[int, int] = {}
        for path in self._paths:
            mapped = self._maps.get(path)
            if mapped is not None:
                (started,) = fmt.COUNTER.unpack_from(mapped, fmt.EVENTS_STARTED_OFFSET)
                (notes,) = fmt.COUNTER.unpack_from(mapped, fmt.STRTAB_USED_OFFSET)
                known = self._known.get(path)
            elif path in self._known:
                continue  # (read once: no rank in it)
            else:
                try:
                    meta, started, notes = read_counters(path)
                except DoctorError:
                    continue  # being created, or damaged: the full read will say which
                known = self._known[path] = _rank_process(meta, path)
                if known is None:
                    continue
                self._map(path)
                current = self.ranks.get(known.rank)
                if current is None or current.started_ns <= known.started_ns:
                    self.ranks[known.rank] = known  # a restarted rank replaces the old one
            if known is not None and self.ranks.get(known.rank) is known:
                counts[known.rank] = started
                self.notes[known.rank] = notes
        # a launcher's restart: the latest attempt's ranks only (one that began joining, or
        # raised before it, counts: its ranks have no capture yet)
        latest = self.attempt = max(
            [p.attempt for p in self.ranks.values()] + list(self._marker_attempts), default=(0, 0))
        for rank in [r for r, p in self.ranks.items() if p.attempt != latest]:
            del self.ranks[rank]
            counts.pop(rank, None)
            self.notes.pop(rank, None)
        return counts

    def _list(self) -> None:
        """The folder's captures listed again, when it may hold others than last time."""
        if not self._folder.moved():
            return
        self._paths = capture_files(self.directory)
        self._marker_attempts = set(joining.launches_begun(self.directory)) | {own_launch()}
        for gone in set(self._maps) - set(self._paths):
            self._maps.pop(gone).close()

    def _map(self, path: Path) -> None:
        """The capture's header page, mapped for its counters (a file that cannot be mapped
        is read as before, a system call a poll)."""
        try:
            with path.open("rb") as fh:
                self._maps[path] = mmap.mmap(fh.fileno(), fmt.HEADER_SIZE,
                                             access=mmap.ACCESS_READ)
        except (OSError, ValueError):
            self._known.pop(path, None)  # (read again next poll)

    def close(self) -> None:
        for mapped in self._maps.values():
            mapped.close()
        self._maps.clear()

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
            attempt=attempt_of(meta.get("env") if isinstance(meta.get("env"), dict) else {}),
        )
    except (KeyError, TypeError, ValueError):
        return None


def proc_state(pid: int) -> ProcState:
    """One look at a process. A pid on another host reads as not alive: the watchdog only
    samples ranks on its own host (multi-node jobs need a supervisor per node). On Linux one
    read of ``/proc/PID/stat`` (a watchdog look reads every rank's: 64 of them a second);
    elsewhere psutil."""
    if _PROC_STAT:
        try:
            with open(f"/proc/{pid}/stat", "rb") as fh:
                data = fh.read()
        except FileNotFoundError:
            return ProcState(pid, False, "gone")
        except OSError:
            pass  # (not readable here: psutil says why)
        else:
            fields = data[data.rfind(b")") + 2:].split()  # (the name may hold spaces)
            try:
                status = _STATES.get(fields[0].decode(), "unknown")
                cpu = (int(fields[11]) + int(fields[12])) / _TICKS
            except (IndexError, ValueError):
                return _psutil_state(pid)
            return ProcState(pid, status not in (psutil.STATUS_ZOMBIE, psutil.STATUS_DEAD),
                             status, cpu)
    return _psutil_state(pid)


def _psutil_state(pid: int) -> ProcState:
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


#: /proc/PID/stat's state letter -> psutil's status word (as psutil maps it)
_STATES = {"R": psutil.STATUS_RUNNING, "S": psutil.STATUS_SLEEPING,
           "D": psutil.STATUS_DISK_SLEEP, "T": psutil.STATUS_STOPPED,
           "t": psutil.STATUS_TRACING_STOP, "Z": psutil.STATUS_ZOMBIE, "X": psutil.STATUS_DEAD,
           "x": psutil.STATUS_DEAD, "K": "wake-kill", "W": psutil.STATUS_WAKING,
           "I": psutil.STATUS_IDLE, "P": psutil.STATUS_PARKED}
_PROC_STAT = sys.platform.startswith("linux") and os.path.exists("/proc/self/stat")
_TICKS = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
