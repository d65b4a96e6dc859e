"""The typed stack model: one Python stack sample per rank, and the one parser that builds it.

Both producers speak the same JSON: ``py-spy dump --json`` (from outside the rank) and the in-rank
agent (a thread reading ``sys._current_frames``) print a list of thread objects whose ``frames`` are
innermost first. ``parse_stack_json`` reads either; nothing here runs a process or touches a file.

Frames of nccl-doctor's own code are dropped as a stack is read: a rank waiting in ``work.wait()``
sits in the recorder's wrapper, and its stack must end at the user's line, not at ours.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace
from typing import Any, Iterable

from nccl_doctor import paths
from nccl_doctor.location import Location
from nccl_doctor import bounded_json

__all__ = ["SOURCES", "ThreadStack", "RankStack", "parse_stack_json"]

#: Who took a sample: py-spy from outside, the in-rank agent thread, or a faulthandler dump.
SOURCES = ("py-spy", "agent", "faulthandler")


@dataclass(frozen=True)
class ThreadStack:
    """One thread's Python stack; ``frames`` innermost first (py-spy's order)."""

    thread_id: int
    name: str | None
    frames: tuple[Location, ...]
    active: bool | None
    owns_gil: bool | None
    is_main: bool

    @property
    def root_first(self) -> tuple[Location, ...]:
        """The frames outermost first (``<module>`` first), the order stacks are compared in."""
        return self.frames[::-1]

    def to_json(self) -> dict[str, Any]:
        return {
            "thread_id": self.thread_id, "name": self.name, "active": self.active,
            "owns_gil": self.owns_gil, "is_main": self.is_main,
            "frames": [f.to_json() for f in self.frames],
        }


@dataclass(frozen=True)
class RankStack:
    """The threads of one rank's process at ``taken_at`` (seconds since the epoch).

    ``error`` is set, and ``threads`` empty, when no sample could be taken; it says why in one line.
    """

    rank: int
    pid: int
    source: str
    threads: tuple[ThreadStack, ...]
    error: str | None = None
    taken_at: float = 0.0
    # the thread the rank's collectives run on (the thread id its capture recorded for the call
    # it is in, or made last: analysis/calls/threads.py), when known
    focus: int | None = None

    @property
    def main(self) -> ThreadStack | None:
        """The main thread, else the first thread (a guess), else None."""
        for thread in self.threads:
            if thread.is_main:
                return thread
        return self.threads[0] if self.threads else None

    @property
    def thread(self) -> ThreadStack | None:
        """The thread that makes the rank's collectives - Ray Train's, Lightning's or an async
        RL loop's thread is not the main one: the ``focus`` thread when it is in the sample,
        else a thread inside torch.distributed (the main one first), else the main thread."""
        for thread in self.threads:
            if self.focus is not None and thread.thread_id == self.focus:
                return thread
        main = self.main
        inside = [t for t in self.threads if any(IN_DISTRIBUTED.search(f.path) for f in t.frames)]
        if inside and main not in inside:
            return inside[0]
        return main

    def signature(self) -> tuple[tuple[str, str, int], ...]:
        """``thread``'s (path, function, line) root first; same signatures mean "not moved"."""
        thread = self.thread
        if thread is None:
            return ()
        return tuple((f.path, f.function, f.line) for f in thread.root_first)

    def to_json(self) -> dict[str, Any]:
        return {
            "rank": self.rank, "pid": self.pid, "source": self.source, "taken_at": self.taken_at,
            "error": self.error, "threads": [t.to_json() for t in self.threads],
        }


#: a frame of torch.distributed (stacks/places.py reads where in it a rank waits)
IN_DISTRIBUTED = re.compile(r"torch[/\\]distributed[/\\]")


def stack_from_json(raw: Any, rank: int) -> RankStack:
    """The stack ``RankStack.to_json`` wrote. Raises ValueError for anything else."""
    if not isinstance(raw, dict) or not isinstance(raw.get("threads"), list):
        raise ValueError(f"the stack of rank {rank} is not a stack record")
    threads = []
    for t in raw["threads"]:
        if not isinstance(t, dict) or not isinstance(t.get("frames"), list):
            raise ValueError(f"a thread of rank {rank} is not a thread record")
        frames = []
        for f in t["frames"]:
            if not isinstance(f, dict):
                raise ValueError(f"a frame of rank {rank} is not a frame record")
            line = f.get("line")
            frames.append(Location(str(f.get("path", "?")), line if _is_int(line) else 0,
                                   str(f.get("function", ""))))
        tid = t.get("thread_id")
        # (stacks kept by an older nccl-doctor still hold its own frames)
        threads.append(ThreadStack(tid if _is_int(tid) else 0, t.get("name"), _users(frames),
                                   t.get("active"), t.get("owns_gil"), bool(t.get("is_main"))))
    pid, taken = raw.get("pid"), raw.get("taken_at")
    return RankStack(rank, pid if _is_int(pid) else 0, str(raw.get("source", "?")),
                     tuple(threads), raw.get("error") if isinstance(raw.get("error"), str) else None,
                     float(taken) if isinstance(taken, (int, float)) else 0.0)


def parse_stack_json(
    text_or_obj: str | bytes | list[Any],
    *,
    rank: int,
    pid: int,
    source: str,
    taken_at: float = 0.0,
) -> RankStack:
    """A ``RankStack`` from py-spy's ``dump --json`` output or the agent's (already decoded or not).

    The main thread is the one flagged ``"is_main": true`` (agent), else the one whose
    ``os_thread_id`` is the process id (py-spy), else the one named ``MainThread``. Raises
    ``ValueError`` with a one-line message on anything that is not that shape.
    """
    if source not in SOURCES:
        raise ValueError(f"unknown stack source {source!r} (expected one of {', '.join(SOURCES)})")
    data: Any = text_or_obj
    if isinstance(text_or_obj, (str, bytes, bytearray)):
        try:
            data = bounded_json.loads(bytes(text_or_obj) if isinstance(text_or_obj, bytearray)
                                      else text_or_obj)
        except ValueError as err:
            raise ValueError(f"stack dump of rank {rank} is not JSON: {err}") from None
    if not isinstance(data, list):
        raise ValueError(
            f"stack dump of rank {rank} is a JSON {type(data).__name__}, expected a list of threads"
        )
    threads = [_thread(t, i, rank) for i, t in enumerate(data)]
    main_index = _main_index(data, pid)
    if main_index is not None:
        threads[main_index] = replace(threads[main_index], is_main=True)
    return RankStack(rank, pid, source, tuple(threads), None, float(taken_at))


def _thread(obj: Any, index: int, rank: int) -> ThreadStack:
    where = f"rank {rank} thread #{index}"
    if not isinstance(obj, dict):
        raise ValueError(f"{where} is a JSON {type(obj).__name__}, expected an object")
    tid = obj.get("thread_id")
    if not _is_int(tid):
        raise ValueError(f"{where} has no integer thread_id (got {tid!r})")
    name = _optional(obj, "thread_name", str, where)
    frames = obj.get("frames")
    if not isinstance(frames, list):
        raise ValueError(f"{where} has no frames list")
    parsed = _users(_frame(f, f"{where} frame #{j}") for j, f in enumerate(frames))
    active = _optional(obj, "active", bool, where)
    gil = _optional(obj, "owns_gil", bool, where)
    return ThreadStack(tid, name, parsed, active, gil, is_main=False)


def _frame(obj: Any, where: str) -> Location:
    if not isinstance(obj, dict):
        raise ValueError(f"{where} is a JSON {type(obj).__name__}, expected an object")
    name, path, line = obj.get("name"), obj.get("filename"), obj.get("line")
    if not isinstance(name, str) or not isinstance(path, str):
        raise ValueError(f"{where} needs string name and filename (got {name!r}, {path!r})")
    if line is None:  # a frame caught between lines (f_lineno may be None): keep it, line unknown
        line = 0
    if not _is_int(line):
        raise ValueError(f"{where} has a non-integer line {line!r}")
    return Location(path, line, name)


def _users(frames: Iterable[Location]) -> tuple[Location, ...]:
    """``frames`` without nccl-doctor's own (paths.is_doctor_file)."""
    return tuple(f for f in frames if not paths.is_doctor_file(f.path))


def _main_index(data: list[dict[str, Any]], pid: int) -> int | None:
    rules = (
        lambda t: t.get("is_main") is True,
        lambda t: t.get("os_thread_id") == pid,
        lambda t: t.get("thread_name") == "MainThread",
    )
    for rule in rules:
        for i, thread in enumerate(data):
            if rule(thread):
                return i
    return None


def _optional(obj: dict[str, Any], key: str, kind: type, where: str) -> Any:
    value = obj.get(key)
    if value is not None and not isinstance(value, kind):
        raise ValueError(f"{where} has a {type(value).__name__} {key}, expected {kind.__name__}")
    return value


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)
