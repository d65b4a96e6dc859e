"""Which thread makes a rank's collectives: the thread its capture recorded for the call it is
in, else for its last call. Ray Train runs the user's function on a thread of its own
(``TrainingThread``), as do Lightning and async RL loops; the main thread then sits in the
framework's loop and says nothing about the hang. Pure."""

from __future__ import annotations

from dataclasses import replace
from typing import Mapping

from nccl_doctor.analysis.calls.align import blocked_event
from nccl_doctor.model import EventKind, RankTrace, TraceSet
from nccl_doctor.stacks.rank_stack import RankStack

_CALLS = (EventKind.COLLECTIVE, EventKind.P2P, EventKind.WAIT)


def collective_thread(trace: RankTrace) -> int | None:
    """The thread id of the call ``trace``'s rank is inside, else of its last call (None: it
    made none)."""
    blocked = blocked_event(trace)
    if blocked is not None:
        return blocked.thread
    last = next((e for e in reversed(trace.events) if e.kind in _CALLS), None)
    return last.thread if last is not None else None


def focused(stacks: Mapping[int, RankStack], traces: TraceSet | None) -> dict[int, RankStack]:
    """``stacks`` with each rank's ``focus`` set to the thread of its collectives."""
    out = dict(stacks)
    if traces is None:
        return out
    for rank, stack in stacks.items():
        trace = traces.ranks.get(rank)
        tid = collective_thread(trace) if trace is not None else None
        if tid is not None and tid != stack.focus:
            out[rank] = replace(stack, focus=tid)
    return out
