"""What a live job is doing right now, from one look at its captures and processes (pure).

The watchdog calls ``assess`` on every look and adds time: a situation only becomes a hang once
it has held long enough (nccl_doctor/supervisor/watchdog.py; docs/watchdog.md says the policy).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from nccl_doctor.analysis.calls.align import blocked_event
from nccl_doctor.diagnosis import Diagnosis, Finding, FindingKind
from nccl_doctor.model import Event, EventKind, EventState, ExitKind, RankTrace, TraceSet

DESYNC = (FindingKind.COLLECTIVE_MISMATCH, FindingKind.MISSING_COLLECTIVE,
          FindingKind.RANK_EXITED, FindingKind.NODE_LOST, FindingKind.GROUP_MISMATCH,
          FindingKind.BLOCKED_WAIT, FindingKind.P2P_MISMATCH)


class Situation(str, enum.Enum):
    NO_RANKS = "no_ranks"  # no live rank has joined a process group (yet, or any more)
    COMPUTING = "computing"  # no live rank is inside a collective
    DEADLOCK = "deadlock"  # every live rank waits, and the collectives they wait in cannot complete
    WAITING_ON_PEERS = "waiting_on_peers"  # some ranks wait on peers that are outside collectives
    ALL_WAITING = "all_waiting"  # every live rank waits in consistent collectives (slow or stalled)


@dataclass(frozen=True)
class ProcState:
    """One look at a rank's process (psutil)."""

    pid: int
    alive: bool
    status: str = ""  # psutil's: running, sleeping, disk-sleep, stopped, zombie, ...
    cpu_seconds: float = 0.0  # user + system time so far

    @property
    def stopped(self) -> bool:
        return self.status in ("stopped", "tracing-stop")


@dataclass(frozen=True)
class Assessment:
    situation: Situation
    live: tuple[int, ...]
    waiting: dict[int, Event]  # rank -> the call it is blocked in
    awaited: tuple[int, ...]  # live ranks outside any collective, while others wait
    stopped: tuple[int, ...]  # live ranks whose process is stopped (SIGSTOP, a debugger)
    cause: Finding | None  # the desync that explains a deadlock, if any

    @property
    def key(self) -> tuple:
        """Identifies the situation across looks: the same key twice means nothing moved."""
        cause = None
        if self.cause is not None:
            cause = (self.cause.kind, self.cause.group, self.cause.seq, self.cause.ranks)
        return (self.situation, tuple(sorted((r, e.idx) for r, e in self.waiting.items())),
                self.awaited, cause)


def assess(traces: TraceSet, diagnosis: Diagnosis, procs: dict[int, ProcState]) -> Assessment:
    """Classify one look at a live job. ``diagnosis`` is ``analyze(traces)``."""
    live = tuple(sorted(
        r for r, t in traces.ranks.items()
        if t.exit.kind is ExitKind.RUNNING and (r not in procs or procs[r].alive)
    ))
    stopped = tuple(r for r in live if r in procs and procs[r].stopped)
    waiting = {}
    for r in live:
        if r in stopped:  # whatever its capture says, a stopped process waits for nobody
            continue
        e = waiting_in(traces.ranks[r])
        if e is not None:
            waiting[r] = e
    if not live:
        return Assessment(Situation.NO_RANKS, live, waiting, (), stopped, None)
    if not waiting:
        return Assessment(Situation.COMPUTING, live, waiting, (), stopped, None)
    awaited = tuple(r for r in live if r not in waiting)
    if awaited:
        return Assessment(Situation.WAITING_ON_PEERS, live, waiting, awaited, stopped,
                          _cause(diagnosis))
    cause = _cause(diagnosis)
    if cause is not None and _explains(cause, waiting):
        return Assessment(Situation.DEADLOCK, live, waiting, (), stopped, cause)
    return Assessment(Situation.ALL_WAITING, live, waiting, (), stopped, None)


def waiting_in(trace: RankTrace) -> Event | None:
    """What the rank is blocked in: a call into torch.distributed still running - a
    collective, a point-to-point call, a wait, or the making of a process group (a rank inside
    ``new_group`` waits for the world's ranks to make the same group: it is no computing
    rank)."""
    e = blocked_event(trace)
    if e is not None:
        return e
    for e in reversed(trace.events[-16:]):
        if e.state is EventState.ENTERED and e.kind is EventKind.GROUP:
            return e
    return None


def _explains(cause: Finding, waiting: dict[int, Event]) -> bool:
    """Whether the desync is about the calls the ranks wait in. A rank blocked in a Python call
    waits in the newest collective it issued, so a desync always is. A call in flight (returned
    on the CPU, not completed) may be followed by later calls on the same rank: a desync in those
    (a rank whose CPU is one collective behind) says nothing about the collective everyone is
    still completing, which may just be slow."""
    if not any(e.in_flight for e in waiting.values()):
        return True
    return any((e.group, e.align_seq) == (cause.group, cause.seq) for e in waiting.values())


def _cause(diagnosis: Diagnosis) -> Finding | None:
    """The desync that explains why waiting ranks cannot go on (the analysis's root cause)."""
    root = diagnosis.root_cause
    if root is not None and root.kind in DESYNC:
        return root
    return next((f for f in diagnosis.findings if f.kind in DESYNC), None)
