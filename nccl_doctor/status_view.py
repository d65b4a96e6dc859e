"""What the live status shows: one look at the running job (pure data).

The supervisor's watchdog builds a ``LiveView`` on request (nccl_doctor/supervisor/view.py); the
live display (nccl_doctor.reporters.status_line) only renders it.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

#: What ``RankView.calls`` counts, as the live status names it: the calls the rank's recorder
#: has seen - those made through torch.distributed's Python API, and the functional collectives
#: (DTensor, funcol) at the dispatcher. A collective torch issues from C++ on its own (DDP's
#: gradient all-reduces, from its reducer) is not among them: a DDP job hung in its all_reduce
#: #14 may show ``Python calls 0:1 1:1`` (docs/watchdog.md).
COUNTED = "Python calls"


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
    calls: int  # calls recorded so far (its capture's progress counter): COUNTED
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
