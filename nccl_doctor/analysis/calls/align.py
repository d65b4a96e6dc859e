"""Line up every rank's collectives by (process group, sequence number)."""

from __future__ import annotations

import functools
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Callable, TypeVar

from nccl_doctor.model import Event, EventKind, EventSource, EventState, RankTrace, TraceSet
from nccl_doctor.words import ranks_verb

#: Ops that are one operation under several names (deprecated aliases and renames).
OP_ALIASES = {
    "_all_gather_base": "all_gather_into_tensor",
    "all_gather_single": "all_gather_into_tensor",
    "_reduce_scatter_base": "reduce_scatter_tensor",
    "reduce_scatter_single": "reduce_scatter_tensor",
}


def canonical_op(op: str) -> str:
    return OP_ALIASES.get(op, op)


def wrapper_indices(trace: RankTrace) -> set[int]:
    """Records that enclose other recorded calls (object collectives, aliases, batches).

    A WAIT record's parent is the async op it waits on, not an enclosing call: not counted.
    """
    return {e.parent for e in trace.events if e.parent and e.kind is not EventKind.WAIT}


def leaf_collectives(trace: RankTrace) -> list[Event]:
    """Collectives that took a sequence number themselves (not wrappers around others)."""
    parents = wrapper_indices(trace)
    return [
        e for e in trace.events
        if e.kind is EventKind.COLLECTIVE and e.seq >= 0 and e.idx not in parents
        and not e.is_composite and e.seq_delta != 0
    ]


@dataclass(frozen=True)
class GroupTimeline:
    """Per group: each rank's collectives by aligned sequence number."""

    name: str
    members: tuple[int, ...]
    calls: dict[int, dict[int, Event]]  # align_seq -> rank -> event
    last_seq: dict[int, int]  # rank -> highest align_seq entered (0: none)
    # rank -> the align_seqs it made between two of its recorded calls that nothing recorded
    # (``unseen``): calls the doctor did not see, never calls the rank did not make
    unseen: dict[int, tuple[int, ...]] = field(default_factory=dict)

    def seqs(self) -> list[int]:
        return sorted(self.calls)


_T = TypeVar("_T")


def keep_last(fn: Callable[[TraceSet], _T]) -> Callable[[TraceSet], _T]:
    """``fn`` that keeps its most recent answer: the passes ask for the same traces in turn,
    and a TraceSet is never changed (a new look is a new object)."""
    last: list = []  # [traces, fn(traces)]

    @functools.wraps(fn)
    def kept(traces: TraceSet) -> _T:
        if last and last[0] is traces:
            return last[1]
        out = fn(traces)
        last[:] = [traces, out]
        return out

    return kept


@keep_last
def timelines(traces: TraceSet) -> dict[str, GroupTimeline]:
    """Per process group, every rank's collectives lined up."""
    calls: dict[str, dict[int, dict[int, Event]]] = defaultdict(lambda: defaultdict(dict))
    holes: dict[str, dict[int, tuple[int, ...]]] = defaultdict(dict)
    for rank, trace in traces.ranks.items():
        leaves = leaf_collectives(trace)
        for e in leaves:
            calls[e.group][e.align_seq].setdefault(rank, e)
        for group, seqs in unseen(trace, leaves).items():
            holes[group][rank] = seqs
    out = {}
    for name, by_seq in sorted(calls.items()):  # (a window starts in any group)
        members = traces.group_members(name)
        last = {r: 0 for r in members if r in traces.ranks}
        for seq, by_rank in by_seq.items():
            for rank in by_rank:
                last[rank] = max(last.get(rank, 0), seq)
        out[name] = GroupTimeline(name, members, dict(by_seq), last, holes.get(name, {}))
    return out


MAX_UNSEEN = 64  # unseen sequence numbers kept per rank and group


def unseen(trace: RankTrace, leaves: list[Event]) -> dict[str, tuple[int, ...]]:
    """Per group, the sequence numbers a rank took between two of its recorded collectives
    with nothing recorded between them in its capture: calls it made that nobody saw (issued
    from C++ without a Python frame, a functional collective under torch.inference_mode). A
    recorded destroy_process_group of the group ends its numbers too (it records the number
    the next call would have had). Records the capture lost (a lapped ring, a window) are not
    counted: the two records must be neighbours in the capture, every record between them
    present."""
    ends = [e for e in trace.events if e.kind is EventKind.DESTROY and e.seq >= 0
            and e.source is not EventSource.FLIGHT_RECORDER]
    if not ends and _no_gap(leaves):
        return {}  # (the common case, cheaply: a leader reads 8,192 ranks' summaries at once)
    position: dict[int, int] = {}  # record index -> its place in the capture, made at a gap
    out: dict[str, list[int]] = defaultdict(list)
    last: dict[str, Event] = {}
    for e in sorted([*leaves, *ends], key=lambda x: (x.group, x.align_seq, x.idx)):
        if e.align_seq < 0:
            continue
        before = last.get(e.group)
        last[e.group] = e
        if before is None or before.kind is EventKind.DESTROY:
            continue
        expected = before.align_seq + max(before.seq_delta or 1, 1)
        if e.align_seq <= expected:
            continue
        if not position:
            recorded = (x for x in trace.events if x.source is not EventSource.FLIGHT_RECORDER)
            position.update((x.idx, i) for i, x in enumerate(recorded))
        a, b = position.get(before.idx), position.get(e.idx)
        if a is None or b is None or b - a != e.idx - before.idx:
            continue  # records between them are missing from the capture
        seqs = out[e.group]
        seqs.extend(range(expected, min(e.align_seq, expected + MAX_UNSEEN - len(seqs))))
    return {g: tuple(s) for g, s in out.items() if s}


def _no_gap(leaves: list[Event]) -> bool:
    """Whether, in capture order, each group's calls follow one another without a skipped
    sequence number (then, sorted, they do too)."""
    last: dict[str, tuple[int, int]] = {}  # group -> (its last align_seq, the next expected)
    for e in leaves:
        seq = e.seq
        if seq < 0:
            continue
        seq -= e.seq_offset
        before = last.get(e.group)
        if before is not None and not before[0] < seq <= before[1]:
            return False
        delta = e.seq_delta
        last[e.group] = (seq, seq + (delta if delta is not None and delta > 1 else 1))
    return True


def blocked_event(trace: RankTrace) -> Event | None:
    """The innermost call the rank was still inside at the end of its capture, if any."""
    for e in reversed(trace.events):
        if e.state is EventState.ENTERED and e.kind is not EventKind.GROUP:
            return e
    return None


def last_leaf(trace: RankTrace) -> Event | None:
    leaves = [e for e in trace.events if e.kind in (EventKind.COLLECTIVE, EventKind.P2P)]
    parents = wrapper_indices(trace)
    leaves = [e for e in leaves if e.idx not in parents]
    return leaves[-1] if leaves else None


UNSEEN_WHY = ("issued from C++ without a Python frame (a C++ extension, a functional collective "
              "under torch.inference_mode)")


def unseen_lines(traces: TraceSet) -> list[str]:
    """One line per group and the sequence numbers its recorded calls skip, the ranks that
    skipped the same said together."""
    out = []
    for name, timeline in timelines(traces).items():
        alike: dict[tuple[int, ...], list[int]] = {}
        for rank, seqs in sorted(timeline.unseen.items()):
            alike.setdefault(tuple(seqs), []).append(rank)
        for seqs, ranks in alike.items():
            shown = ", ".join(f"#{s}" for s in seqs[:6]) + (" ..." if len(seqs) > 6 else "")
            many = len(seqs) > 1
            out.append(ranks_verb(ranks, f"made {'collectives' if many else 'a collective'} at "
                                  f"{'sequence numbers' if many else 'sequence number'} {shown} "
                                  f"of group {name} that {'were' if many else 'was'} not "
                                  f"recorded: {UNSEEN_WHY}; the calls after keep their own "
                                  "numbers, and no rank is blamed for them"))
    return out
