"""What each rank was doing at one moment - when the user's interrupt came: in which call it
waited and for how long, or that it was outside the collectives, its last one returned. Ranks
doing the same are said together."""

from __future__ import annotations

import os

from nccl_doctor.analysis.calls.wording import call_name, duration
from nccl_doctor.model import Event, RankTrace, TraceSet
from nccl_doctor.words import ranks_verb

#: the parts of the sentence said (the rest counted)
MAX_PARTS = 4


def _last_before(trace: RankTrace, at_ns: int) -> Event | None:
    """The rank's last top-level call entered by ``at_ns``."""
    last = None
    for e in trace.events:
        if e.parent == 0 and e.t_enter_ns <= at_ns:
            last = e
    return last


def _call(e: Event) -> str:
    """"all_reduce #8 (group 0) at train.py:48": the file by its name alone, so that the words
    are the same wherever they are said (the live run's working directory, a replay's)."""
    where = (f" at {os.path.basename(e.callsite.path)}:{e.callsite.line}"
             if e.callsite is not None else "")
    return call_name(e) + where


def doing_at(traces: TraceSet, at_ns: int) -> str:
    """"ranks 0, 2 had waited 3.21 s in all_reduce #8 (group 0) at train.py:48; rank 1 was
    outside the collectives, after all_reduce #7 (group 0) at train.py:48" (and "rank 3 had
    made no collective call yet"; "" where no rank had made one by then)."""
    waiting: dict[str, tuple[list[int], int]] = {}  # the call -> its ranks, the longest wait
    outside: dict[str, list[int]] = {}  # the last call returned -> its ranks
    before: list[int] = []  # ranks that had made no call yet
    for rank in sorted(traces.ranks):
        e = _last_before(traces.ranks[rank], at_ns)
        if e is None:
            before.append(rank)
            continue
        if e.t_exit_ns is None or e.t_exit_ns > at_ns:
            ranks, longest = waiting.get(_call(e), ([], 0))
            waiting[_call(e)] = ([*ranks, rank], max(longest, at_ns - e.t_enter_ns))
        else:
            outside.setdefault(_call(e), []).append(rank)
    parts = [ranks_verb(ranks, f"had waited {duration(waited / 1e9)} in {call}")
             for call, (ranks, waited) in waiting.items()]
    parts += [ranks_verb(ranks, f"was outside the collectives, after {call}")
              for call, ranks in outside.items()]
    if before and (waiting or outside):  # (none of them had: nothing is said)
        parts.append(ranks_verb(before, "had made no collective call yet"))
    more = len(parts) - MAX_PARTS
    said = "; ".join(parts[:MAX_PARTS])
    return said + (f"; {more} more" if more > 0 else "")
