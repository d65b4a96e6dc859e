"""Which side of a mismatched collective is a pass ahead (pure, from the calls).

Two ranks whose calls at sequence number N of a group differ may be at the same line of the
user's loop in different passes: a rank that left one pass early (``continue`` before the
backward) makes the next pass's calls while its peer is still in the last one - FSDP2's
all-gather of the next forward meeting the peer's reduce-scatter, both under
``loss.backward()``. The branches on their paths are then the same, and the source alone
cannot tell who left. The calls can: before its call N, the rank ahead had gone further in its
other groups (the tensor-parallel all_reduce of the next forward) than its peer, line for line,
and nowhere less far. It is the side that skipped the rest of a pass; what made it skip is a
jump before the *behind* side's call, in the loop they share."""

from __future__ import annotations

from typing import Sequence

from nccl_doctor.analysis.calls.align import leaf_collectives, timelines
from nccl_doctor.analysis.calls.wording import site_key
from nccl_doctor.analysis.why.loop_counts import Side
from nccl_doctor.diagnosis import Finding, FindingKind
from nccl_doctor.model import Event, RankTrace, TraceSet

__all__ = ["ahead_side", "further", "progress"]

_Site = tuple[str, int, str]


def ahead_side(f: Finding, sides: Sequence[Side], traces: TraceSet,
               ) -> tuple[int, dict[_Site, int]] | None:
    """The index of the side a pass ahead of every other in ``f`` (a mismatch), with how far
    ahead it was at each site of its other groups; None when no side is.

    Read from sequence numbers, not counts, so that a window of a large job's records (the
    newest ones, those around the divergence) reads the same: at each call site of the user's
    (the issuing line and the op) that both sides used in groups other than ``f``'s, the
    sequence number of each side's latest call there before its call N. The groups at one site
    do the same work on every rank (a tensor-parallel all_reduce of the forward), so a side
    whose numbers are higher at some sites and lower at none had gone on further."""
    if f.kind is not FindingKind.COLLECTIVE_MISMATCH or f.group is None or f.seq is None:
        return None
    at = timelines(traces).get(f.group)
    calls = at.calls.get(f.seq, {}) if at is not None else {}
    latest: list[dict[_Site, int]] = []
    for side in sides:
        rank = side.ranks[0]
        trace, call = traces.ranks.get(rank), calls.get(rank)
        if trace is None or call is None:
            return None
        latest.append(progress(trace, call, f.group))
    for i, mine in enumerate(latest):
        more: dict[_Site, int] = {}
        for j, theirs in enumerate(latest):
            if j == i:
                continue
            gone = further(mine, theirs)
            if not gone:
                break
            for s, n in gone.items():
                more[s] = max(more.get(s, 0), n)
        else:
            if more:
                return i, more
    return None


def progress(trace: RankTrace, call: Event, group: str | None) -> dict[_Site, int]:
    """At each call site of the rank's groups but ``group``, the sequence number of its latest
    call there before ``call``: how far it had gone."""
    out: dict[_Site, int] = {}
    for e in leaf_collectives(trace):
        if e.idx < call.idx and e.group != group and (s := site_key(e)) is not None:
            out[s] = max(out.get(s, -1), e.align_seq)
    return out


def further(mine: dict[_Site, int], theirs: dict[_Site, int]) -> dict[_Site, int]:
    """Where ``mine`` had gone further than ``theirs`` and how far, when it had at some site
    they share and was behind at none; empty otherwise."""
    shared = set(mine) & set(theirs)
    if not shared or any(mine[s] < theirs[s] for s in shared):
        return {}
    return {s: mine[s] - theirs[s] for s in shared if mine[s] > theirs[s]}
