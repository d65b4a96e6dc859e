"""Which ranks of a quiet job of many nodes the leader reads in full (pure).

At scale a quiet node sends its ranks' digests (capture/summary.py ``digest``): each group's last
call, and the rank's end. Most ranks of a deadlocked job look alike there - every member of a
group waits in the same call - and the ranks that explain the deadlock part from their group: a
different call at the group's newest sequence number (a mismatch), an older one (the rank that
never arrived), no call at all while their peers wait (a rank computing, or blocked outside
collectives), or an end. Those ranks' nodes are asked for their full summaries (their lines, the
branch); the others stay digests, which say enough to compare them.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from typing import Iterable

from nccl_doctor.model import EventState, ExitKind, RankTrace


def odd_ranks(traces: Iterable[RankTrace]) -> set[int]:
    """The ranks whose last call in some group is not the one most of the group's members
    show, that are in no call while most ranks wait in one, or that ended."""
    odd: set[int] = set()
    last_in: dict[str, dict[int, tuple]] = defaultdict(dict)  # group -> rank -> its last call
    waiting: dict[int, bool] = {}
    for t in traces:
        if t.exit.kind is not ExitKind.RUNNING:
            odd.add(t.rank)
        last = {}
        for e in t.events:
            if e.group:
                last[e.group] = e
        for group, e in last.items():
            last_in[group][t.rank] = (e.seq, e.op, e.state is EventState.ENTERED or e.in_flight)
        newest = t.events[-1] if t.events else None
        waiting[t.rank] = newest is not None and (newest.state is EventState.ENTERED
                                                  or newest.in_flight)
    for ranks in last_in.values():
        if len(ranks) > 1:
            common = Counter(ranks.values()).most_common(1)[0][0]
            odd.update(r for r, call in ranks.items() if call != common)
    if sum(waiting.values()) * 2 > len(waiting):
        odd.update(r for r, w in waiting.items() if not w)
    return odd
