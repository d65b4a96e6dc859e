"""What the live status shows: one look at the job, as the watchdog last saw it (pure data).

The watchdog builds a ``LiveView`` on request (``Watchdog.view``); the live display
(nccl_doctor.reporters.live) only renders it.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from nccl_doctor.analysis.wording import call_name
from nccl_doctor.analysis.situation import Assessment, Situation


class RankState(str, enum.Enum):
    RUNNING = "running"  # recorded a call since the last look (or not looked at yet)
    COMPUTING = "computing"  # outside any collective, nobody waits on it
    WAITING = "waiting"  # blocked inside a collective
    AWAITED = "awaited"  # outside collectives while others wait on it
    STOPPED = "stopped"  # its process is stopped (SIGSTOP, a debugger)
    ENDED = "ended"  # its process has exited


@dataclass(frozen=True)
class RankView:
    rank: int
    host: str
    calls: int  # calls recorded so far (its capture's progress counter)
    state: RankState
    detail: str = ""  # e.g. the collective it waits in


@dataclass(frozen=True)
class LiveView:
    ranks: tuple[RankView, ...]
    phase: str  # "starting", "running", a Situation value, or "hang"
    message: str  # the watchdog's current one-line status ("" while nothing is wrong)
    quiet_s: float  # seconds since any rank last recorded a call
    elapsed_s: float  # seconds since the watchdog started

    @property
    def calls(self) -> int:
        return sum(r.calls for r in self.ranks)


def rank_views(counts: dict[int, int], hosts: dict[int, str], look: Assessment | None,
               ended: set[int]) -> tuple[RankView, ...]:
    """Each rank's state: from ``look`` when it was made at the current counts, else running."""
    views = []
    for rank in sorted(counts):
        state, detail = RankState.RUNNING, ""
        if rank in ended:
            state = RankState.ENDED
        elif look is not None:
            if rank in look.stopped:
                state = RankState.STOPPED
            elif rank in look.waiting:
                e = look.waiting[rank]
                state, detail = RankState.WAITING, call_name(e)
            elif rank in look.awaited:
                state = RankState.AWAITED
            elif look.situation is Situation.COMPUTING:
                state = RankState.COMPUTING
            elif rank not in look.live:
                state = RankState.ENDED
        views.append(RankView(rank, hosts.get(rank, ""), counts[rank], state, detail))
    return tuple(views)
