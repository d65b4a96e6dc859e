"""The live status's rank lines, from the watchdog's last look (``Watchdog.view`` builds the
``LiveView``; nccl_doctor.reporters.status_line renders it)."""

from __future__ import annotations

from nccl_doctor.analysis.calls.wording import call_name
from nccl_doctor.analysis.calls.situation import Assessment, Situation
from nccl_doctor.status_view import RankState, RankView


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
