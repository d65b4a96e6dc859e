"""Point-to-point as its own model: every send and receive on a (group, src, dst) channel, in each
end's order, and where each rank waits among them.

A send on one rank pairs with a receive on another, the n-th with the n-th, per channel (torch's
and NCCL's rule, tags aside: the recorder does not keep them). Sends and receives never enter the
collective alignment (analysis/calls/align.py keeps collectives only); they share the group's
sequence numbers, which say nothing about pairing.

What is a message: the leaf ``isend``/``irecv`` (or ``send``/``recv`` where torch made no inner
call) - ``send`` records itself around the ``isend`` and ``wait`` it makes, and
``batch_isend_irecv`` is a composite record around its ops (align.wrapper_indices). The ops of a
batch are waited through the batch: their WAIT records name the batch as their parent.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass

from nccl_doctor.analysis.calls.align import blocked_event, keep_last, wrapper_indices
from nccl_doctor.model import Event, EventKind, EventState, RankTrace, TraceSet

SENDS = frozenset({"send", "isend"})
RECVS = frozenset({"recv", "irecv"})

ChannelKey = tuple[str, int, int]  # (group, src, dst), global ranks


@dataclass(frozen=True)
class Channel:
    """One direction between two ranks in one group: each end's calls, in its own order."""

    group: str
    src: int
    dst: int
    sends: tuple[Event, ...]  # on ``src``
    recvs: tuple[Event, ...]  # on ``dst``

    @property
    def short(self) -> bool:
        return len(self.sends) != len(self.recvs)

    @property
    def long_rank(self) -> int:
        """The end that posted more: it waits for the other to post the rest."""
        return self.src if len(self.sends) > len(self.recvs) else self.dst

    @property
    def short_rank(self) -> int:
        return self.dst if self.long_rank == self.src else self.src

    @property
    def excess(self) -> tuple[Event, ...]:
        """The long end's calls nothing on the other end pairs with."""
        n = min(len(self.sends), len(self.recvs))
        return (self.sends if self.long_rank == self.src else self.recvs)[n:]

    def ops(self, rank: int) -> tuple[Event, ...]:
        return self.sends if rank == self.src else self.recvs


@dataclass(frozen=True)
class P2P:
    """Every channel of a trace set (into a rank whose receives name no source -
    ``recv(src=None)`` - none: its channels cannot be counted, and are left out)."""

    channels: dict[ChannelKey, Channel]


def messages(trace: RankTrace) -> list[Event]:
    """A rank's sends and receives that are messages themselves (not wrappers of others)."""
    parents = wrapper_indices(trace)
    return [e for e in trace.events if e.kind is EventKind.P2P and e.idx not in parents
            and not e.is_composite and (e.op in SENDS or e.op in RECVS)]


@keep_last
def p2p_channels(traces: TraceSet) -> P2P:
    sends: dict[ChannelKey, list[Event]] = defaultdict(list)
    recvs: dict[ChannelKey, list[Event]] = defaultdict(list)
    any_source: set[tuple[str, int]] = set()
    for rank, trace in traces.ranks.items():
        for e in messages(trace):
            if e.peer < 0:
                any_source.add((e.group, rank))
            elif e.op in SENDS:
                sends[(e.group, rank, e.peer)].append(e)
            else:
                recvs[(e.group, e.peer, rank)].append(e)
    out = {}
    for key in sorted({*sends, *recvs}):
        group, src, dst = key
        if (group, dst) in any_source:
            continue
        out[key] = Channel(group, src, dst, tuple(sends.get(key, ())), tuple(recvs.get(key, ())))
    return P2P(out)


# -- where a rank waits ------------------------------------------------------------------------

def _waits_on(e: Event) -> tuple[int, ...]:
    """The records whose completion is this message's: itself, and the ``send``/``recv`` or the
    batch around it (a batch's ops are waited through the batch)."""
    return (e.idx, e.parent) if e.parent else (e.idx,)


def held(trace: RankTrace, ops: tuple[Event, ...]) -> tuple[Event, str] | None:
    """The message of ``ops`` the rank is held in: (it, "waits") for the one it is blocked in
    now, (it, "failed") for the one whose wait raised (the backend's timeout, a peer gone), else
    None (every one of them completed, or was never waited for)."""
    if not ops:
        return None
    # (a batch holding several of them: its last, the one a short channel leaves unpaired)
    mine = {idx: e for e in ops for idx in _waits_on(e)}
    blocked = blocked_event(trace)
    if blocked is not None:
        for idx in (blocked.idx, blocked.parent):
            if idx and idx in mine:
                return mine[idx], "waits"
    failed = None
    for x in trace.events:
        if x.state is not EventState.FAILED:
            continue
        for idx in (x.idx, x.parent):
            if idx and idx in mine:
                failed = mine[idx]
    return (failed, "failed") if failed is not None else None


def is_excess(ch: Channel, e: Event) -> bool:
    return any(x is e for x in ch.excess)


def channel_of(p2p: P2P, rank: int, e: Event) -> Channel | None:
    if e.peer < 0:
        return None
    key = (e.group, rank, e.peer) if e.op in SENDS else (e.group, e.peer, rank)
    return p2p.channels.get(key)
