"""Which records of a large job's captures become events: the window a diagnosis needs, found on
columns (capture/records.py) before any record becomes a Python object.

A 1,024-rank job with full rings holds tens of millions of records, nearly all of them the same
collective on every rank and irrelevant to why the job hung. Every rank's leaf collectives (those
that took a sequence number themselves, as analysis/calls/align.py counts them) are lined up per
process group by sequence number with numpy, and compared on what the mismatch pass compares (op,
tensor descriptions, group size, root). The analysis passes then see, per rank, the records
around each group's first divergence and around the last call its slowest member made (where a
missing collective shows), the parents of those records, and the rank's newest records (where a
hang shows): the same divergences, the same missing calls and the same ends as on everything.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping, Sequence

import numpy as np

from nccl_doctor.model import EventFlag, EventKind

@dataclass(frozen=True)
class Size:
    """How large a job must be for its passes to see a window, and how large the window is."""

    #: Records in all above which the passes see a window of them, not every record.
    above: int = 100_000
    #: The newest records of each rank in the window: this many in all, shared by the ranks...
    tails: int = 32_768
    #: ...and at least this many each.
    tail: int = 64

    def per_rank(self, ranks: int) -> int:
        """The newest records each of ``ranks`` ranks keeps."""
        return max(self.tail, self.tails // max(1, ranks))


DEFAULT = Size()

#: Point-to-point records a rank's window keeps whole (every message, so that its channels can
#: be counted): past this many, only those in the window proper, and its channels are not said.
P2P_WHOLE = 65_536

#: Collectives kept on each side of a group's first divergence and of its slowest member's last
#: call (context: the calls each side made before and after it).
MARGIN = 4


@dataclass(frozen=True)
class Leaves:
    """One rank's leaf collectives, per process group (a code shared by every rank): their
    aligned sequence numbers (ascending, the first call of each number), the records' indices,
    and a hash of the compared aspects (op, tensor descriptions, group size, root)."""

    groups: dict[int, tuple[np.ndarray, np.ndarray, np.ndarray]]  # group -> (seq, idx, key)


def codes(strings: Mapping[int, str], table: dict[str, int], rows: np.ndarray) -> np.ndarray:
    """One rank's string id -> a code shared by every rank (``table``: text -> code, grown
    here); ids the rank's table lacks get -1."""
    top = max(max(strings, default=0), int(max((rows[c].max() for c in _NAMED), default=0))
              if len(rows) else 0)
    out = np.full(top + 1, -1, dtype=np.int64)
    for sid, text in strings.items():
        out[sid] = table.setdefault(text, len(table))
    return out


_NAMED = ("op", "group", "input", "output")
_M = np.uint64(0x9E3779B97F4A7C15)


def _mix(h: np.ndarray, x: np.ndarray) -> np.ndarray:
    """Fold ``x`` into the 64-bit hashes ``h`` (splitmix64's finaliser: two different aspect
    tuples share a hash with odds of 2**-64)."""
    with np.errstate(over="ignore"):
        z = (h ^ x.astype(np.uint64)) * _M
        z ^= z >> np.uint64(31)
        z *= np.uint64(0xBF58476D1CE4E5B9)
        return z ^ (z >> np.uint64(29))


def leaves(rows: np.ndarray, exited: np.ndarray, code: np.ndarray) -> Leaves:
    """The leaf collectives of one rank's decoded ``rows`` (records.RECORD, by index);
    ``code`` maps the rank's string ids to codes shared by all ranks."""
    kind, parent = rows["kind"], rows["parent"]
    wrappers = parent[(parent != 0) & (kind != int(EventKind.WAIT))]
    leaf = ((kind == int(EventKind.COLLECTIVE)) & (rows["seq"] >= 0)
            & ((rows["flags"] & int(EventFlag.COMPOSITE)) == 0)
            & (~exited | (rows["seq_delta"] != 0)))
    if len(wrappers):
        leaf &= ~np.isin(rows["idx"], wrappers)
    at = np.flatnonzero(leaf)
    idx = rows["idx"][at].astype(np.int64)
    seq = rows["seq"][at] - rows["seq_offset"][at].astype(np.int64)
    group = code[rows["group"][at]]
    key = np.zeros(len(at), dtype=np.uint64)
    for col in ("op", "input", "output"):
        key = _mix(key, code[rows[col][at]])
    key = _mix(_mix(key, rows["group_size"][at]), rows["peer"][at])
    order = np.lexsort((idx, seq, group))  # by group, then number, then record: first calls
    group, seq, idx, key = group[order], seq[order], idx[order], key[order]
    first = np.ones(len(order), dtype=bool)
    first[1:] = (group[1:] != group[:-1]) | (seq[1:] != seq[:-1])
    group, seq, idx, key = group[first], seq[first], idx[first], key[first]
    bounds = np.flatnonzero(np.diff(group)) + 1
    out = {}
    for lo, hi in zip(np.concatenate([[0], bounds]).tolist(),
                      np.concatenate([bounds, [len(group)]]).tolist()):
        if hi > lo:
            out[int(group[lo])] = (seq[lo:hi], idx[lo:hi], key[lo:hi])
    return Leaves(out)


def _first_difference(a_seq: np.ndarray, a_key: np.ndarray, b_seq: np.ndarray,
                      b_key: np.ndarray) -> int | None:
    """The lowest sequence number both hold with different aspects (None: none)."""
    if len(a_seq) and len(b_seq) and a_seq[0] == b_seq[0] and len(a_seq) == len(b_seq) \
            and a_seq[-1] - a_seq[0] + 1 == len(a_seq) and b_seq[-1] - b_seq[0] + 1 == len(b_seq):
        differ = a_key != b_key  # the common case: the same contiguous numbers
        hits = np.flatnonzero(differ)
        return int(a_seq[hits[0]]) if len(hits) else None
    common, ia, ib = np.intersect1d(a_seq, b_seq, assume_unique=True, return_indices=True)
    hits = np.flatnonzero(a_key[ia] != b_key[ib])
    return int(common[hits[0]]) if len(hits) else None


def focus(by_rank: Mapping[int, Leaves], members: Mapping[int, Sequence[int]],
          partial: bool = False) -> dict[int, list[int]]:
    """Per group code: the sequence numbers around which the passes need every rank's calls -
    the first divergence, and the slowest member's last call and the one it never made.
    ``members``: group code -> its ranks, where the group notes say (a member that never called
    the group's collectives counts as stopped before its first; not when ``partial``). Any rank
    serves as the reference: where not every rank agrees, some rank differs from it."""
    ref: dict[int, tuple[np.ndarray, np.ndarray]] = {}
    points: dict[int, set[int]] = {}
    slowest: dict[int, int] = {}
    seen: dict[int, set[int]] = {}
    for rank in sorted(by_rank):
        for g, (seq, _idx, key) in by_rank[rank].groups.items():
            seen.setdefault(g, set()).add(rank)
            last = int(seq[-1])
            slowest[g] = min(slowest.get(g, last), last)
            if g not in ref:
                ref[g] = (seq, key)
                points[g] = set()
                continue
            diff = _first_difference(*ref[g], seq, key)
            if diff is not None:
                points[g].add(diff)
    out: dict[int, list[int]] = {}
    for g, found in points.items():
        absent = [r for r in members.get(g, ()) if r not in seen[g]
                  and (r in by_rank or not partial)]
        low = 0 if absent else slowest[g]
        out[g] = sorted(found | {low, low + 1})
    return out


def p2p_whole(rows: np.ndarray, kept: np.ndarray) -> bool:
    """Whether ``kept`` (bool per row) holds every point-to-point record of the rank."""
    return not bool((~kept & (rows["kind"] == int(EventKind.P2P))).any())


def keep(rows: np.ndarray, lv: Leaves, points: Mapping[int, list[int]], tail: int) -> np.ndarray:
    """bool per row of one rank: the records the passes see. Around each point of each group
    (``MARGIN`` collectives either side): every record between the first and the last of those
    calls; the rank's newest ``tail`` records; every point-to-point record and the waits on
    them, up to ``P2P_WHOLE`` of them (a channel is paired message by message from its first:
    ``p2p_whole``); and the parents of what is kept."""
    idx = rows["idx"]
    mask = np.zeros(len(rows), dtype=bool)
    mask[max(0, len(rows) - tail):] = True
    p2p = rows["kind"] == int(EventKind.P2P)
    if 0 < int(p2p.sum()) <= P2P_WHOLE:
        mask |= p2p | np.isin(rows["parent"], idx[p2p])
    for g, (seq, g_idx, _key) in lv.groups.items():
        for s in points.get(g, ()):
            lo, hi = np.searchsorted(seq, [s - MARGIN, s + MARGIN + 1])
            if hi > lo:
                near = g_idx[lo:hi]
                mask[np.searchsorted(idx, near.min()):
                     np.searchsorted(idx, near.max(), side="right")] = True
    parents = rows["parent"][mask]
    parents = parents[parents != 0]
    if len(parents):
        mask |= np.isin(idx, parents)
    return mask
