"""How long each rank works per step outside torch.distributed: its own compute. Pure.

A rank's time inside recorded calls (collectives, sends and receives, waits on their work) is
time it waited for others or moved data; the rest of its step is its own work (forward,
backward, data loading, logging). A pipeline's stages are compared by it (one stage working
longer leaves the others idle: analysis/slow/pipeline_balance.py), and a late rank that works no
longer than its peers was kept late by another rank (analysis/slow/straggler.py).

Measured on each rank's own clock, never across ranks, over whole steps: a step starts after each
long pause between the calls at the rank's most repeated call site (its collectives', else its
sends' and receives'), at least half the longest pause, so several calls a step from one line
still make one step. Only blocking waits are time the CPU waited: an NCCL call returns once
enqueued, so a rank with calls on NCCL groups is not measured (``None``).
"""

from __future__ import annotations

from dataclasses import dataclass

from nccl_doctor.analysis.calls.align import keep_last, leaf_collectives
from nccl_doctor.analysis.slow.lateness import on_nccl
from nccl_doctor.analysis.calls.p2p_channels import messages
from nccl_doctor.analysis.calls.steps import at_site, step_starts
from nccl_doctor.model import EventKind, RankTrace, TraceSet

_WAITS = (EventKind.COLLECTIVE, EventKind.P2P, EventKind.WAIT)
MIN_STEPS = 3  # whole steps a rank's figures are read over


@dataclass(frozen=True)
class RankBusy:
    """A rank's work and waits over its whole steps, on its own clock."""

    rank: int
    steps: int
    span_s: float  # from its first step's start to its last's
    waited_s: float  # inside recorded calls in that span (overlapping calls counted once)

    @property
    def busy_s(self) -> float:
        return max(0.0, self.span_s - self.waited_s)

    @property
    def step_s(self) -> float:
        return self.span_s / self.steps

    @property
    def busy_per_step_s(self) -> float:
        return self.busy_s / self.steps


@keep_last
def busy_table(traces: TraceSet) -> dict[int, RankBusy]:
    """Per rank measured over at least ``MIN_STEPS`` whole steps, its work and waits."""
    nccl = {name for name in traces.groups if on_nccl(traces, name)}
    out = {}
    for r, trace in traces.ranks.items():
        found = _measure(trace, nccl)
        if found is not None:
            out[r] = found
    return out


def _measure(trace: RankTrace, nccl: set[str]) -> RankBusy | None:
    calls = [e for e in trace.events if e.kind in _WAITS and e.t_exit_ns is not None]
    if any(e.group in nccl for e in calls):
        return None
    starts = _step_starts(trace)
    if len(starts) < MIN_STEPS + 1:
        return None
    lo, hi = starts[0], starts[-1]
    spans = sorted((max(lo, e.t_enter_ns), min(hi, e.t_exit_ns or 0)) for e in calls
                   if e.t_enter_ns < hi and (e.t_exit_ns or 0) > lo)
    waited, end = 0, lo
    for a, b in spans:  # the union of the calls' intervals
        if b > end:
            waited += b - max(a, end)
            end = b
    return RankBusy(trace.rank, len(starts) - 1, (hi - lo) / 1e9, waited / 1e9)


def _step_starts(trace: RankTrace) -> list[int]:
    """When each of the rank's steps started (analysis/calls/steps.py), read at its collectives,
    else (no collective a step) at its sends and receives."""
    calls = at_site([e for e in leaf_collectives(trace) if e.t_exit_ns is not None])
    if len(calls) < MIN_STEPS + 1:
        calls = at_site([e for e in messages(trace) if e.t_exit_ns is not None and e.peer >= 0])
    return step_starts(calls)
