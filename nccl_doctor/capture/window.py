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

A rank's records are not held while the others are read: what the window needs of them - its
leaf collectives, its record indices and slots (as runs), its point-to-point records and its
parents - is their ``Outline``, made as the capture is read; ``keep`` picks the rows from the
outlines, and the reader reads those rows again (capture/capture_set.py). Codes shared by the
ranks are the hashes of the strings' text, so that each reading thread makes its rank's outline
alone.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping, Sequence

import numpy as np

from nccl_doctor.capture.records import distinct_rows
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


Columns = Mapping[str, np.ndarray]  # a rank's records by field: records.FIELDS, or RECORD rows
#: The fields ``outline`` reads.
FIELDS = ("idx", "parent", "kind", "flags", "seq", "seq_offset", "seq_delta", "group", "op",
          "input", "output", "group_size", "peer")


@dataclass(frozen=True)
class Leaves:
    """One rank's leaf collectives, per process group (a code shared by every rank): their
    aligned sequence numbers (ascending, the first call of each number), the records' positions
    among the rank's records, and a hash of the compared aspects (op, tensor descriptions, group
    size, root)."""

    groups: dict[int, tuple[np.ndarray, np.ndarray, np.ndarray]]  # group -> (seq, pos, key)


def codes(strings: Mapping[int, str], top: int) -> np.ndarray:
    """One rank's string ids (up to ``top``) -> codes shared by every rank: the hash of the
    text (made anywhere, a reading thread included: no table shared by the ranks; two texts
    share a hash with odds of 2**-64), -1 for ids the rank's table lacks."""
    top = max(top, max(strings, default=0))
    out = np.full(top + 1, -1, dtype=np.int64)
    for sid, text in strings.items():
        out[sid] = hash(text)  # (never -1: CPython's hash of a str is not)
    return out


def code(text: str) -> int:
    """The code ``codes`` gives ``text``."""
    return hash(text)


def top_id(rows: Columns) -> int:
    """The largest string id the compared fields of ``rows`` name (0 for none)."""
    return int(max((rows[c].max() for c in _NAMED), default=0)) if len(rows["idx"]) else 0


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


def leaves(rows: Columns, exited: np.ndarray, code: np.ndarray) -> Leaves:
    """The leaf collectives of one rank's records (``rows``: its columns, or records.RECORD
    rows, by index); ``code`` maps the rank's string ids to codes shared by all ranks."""
    kind, parent = rows["kind"], rows["parent"]
    wrappers = parent[(parent != 0) & (kind != int(EventKind.WAIT))]
    seq_all = rows["seq"]
    leaf = ((kind == int(EventKind.COLLECTIVE)) & (seq_all >= 0)
            & ((rows["flags"] & int(EventFlag.COMPOSITE)) == 0)
            & (~exited | (rows["seq_delta"] != 0)))
    if len(wrappers):  # (the records are by index: each wrapper found by a binary search)
        idx = rows["idx"]
        wrappers = np.unique(wrappers)
        where = np.minimum(np.searchsorted(idx, wrappers), len(idx) - 1)
        leaf[where[idx[where] == wrappers]] = False
    at = np.flatnonzero(leaf)
    seq = seq_all[at] - rows["seq_offset"][at].astype(np.int64)
    key = _keys(rows, at, code)
    ids = rows["group"][at]
    found = (np.flatnonzero(np.bincount(ids)) if len(ids) and int(ids.max()) < 1 << 16
             else np.unique(ids).astype(np.int64))  # (the group ids the rank names)
    out = {}
    if len(set(code[found].tolist())) == len(found):  # each group one id (as written)
        for gid in found.tolist():
            mine = np.flatnonzero(ids == gid)
            g_seq = seq[mine]
            if len(g_seq) > 1 and not bool((g_seq[1:] > g_seq[:-1]).all()):
                # numbers out of order, or repeated: by number, then record; first calls
                order = np.lexsort((mine, g_seq))
                mine, g_seq = mine[order], g_seq[order]
                first = np.ones(len(mine), dtype=bool)
                first[1:] = g_seq[1:] != g_seq[:-1]
                mine, g_seq = mine[first], g_seq[first]
            out[int(code[gid])] = (g_seq, at[mine], key[mine])
        return Leaves(out)
    # by group, then number, then record (its position: the records are by index): first calls
    group = code[ids]
    order = np.lexsort((at, seq, group))
    group, seq, pos, key = group[order], seq[order], at[order], key[order]
    first = np.ones(len(order), dtype=bool)
    first[1:] = (group[1:] != group[:-1]) | (seq[1:] != seq[:-1])
    group, seq, pos, key = group[first], seq[first], pos[first], key[first]
    bounds = np.flatnonzero(np.diff(group)) + 1
    for lo, hi in zip(np.concatenate([[0], bounds]).tolist(),
                      np.concatenate([bounds, [len(group)]]).tolist()):
        if hi > lo:
            out[int(group[lo])] = (seq[lo:hi], pos[lo:hi], key[lo:hi])
    return Leaves(out)


def _keys(rows: Columns, at: np.ndarray, code: np.ndarray) -> np.ndarray:
    """The hash of what the mismatch pass compares (op, tensor descriptions, group size, root)
    of the records at ``at``: made once per distinct combination of the rank's ids
    (records.distinct_rows), from the codes shared by every rank (two combinations share a
    hash with odds of 2**-64)."""
    u64 = np.uint64
    op, inp, out = (rows[c][at].astype(u64) for c in ("op", "input", "output"))
    size = rows["group_size"][at].astype(np.uint32).astype(u64)
    peer = rows["peer"][at].astype(np.uint32).astype(u64)
    inverse, first = distinct_rows([op | (inp << u64(32)), out | (size << u64(32)), peer])
    if not len(first):
        return np.zeros(0, dtype=np.uint64)
    c_op, c_in, c_out = (code[col[first]] for col in (op, inp, out))
    g, p = rows["group_size"][at][first], rows["peer"][at][first]
    key = np.zeros(len(first), dtype=np.uint64)
    for col in (c_op, c_in, c_out, g, p):
        key = _mix(key, col)
    return key[inverse]


@dataclass(frozen=True)
class Runs:
    """An integer per position, held as runs of consecutive values (a ring's record indices
    and slots: one run, two once it has lapped, a few more around damage)."""

    starts: np.ndarray  # the position where each run starts
    values: np.ndarray  # the value there
    n: int

    @classmethod
    def of(cls, values: np.ndarray) -> Runs:
        v = np.asarray(values, dtype=np.int64)
        if not len(v):
            return cls(np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64), 0)
        starts = np.concatenate([[0], np.flatnonzero(np.diff(v) != 1) + 1])
        return cls(starts, v[starts], len(v))

    def at(self, pos: np.ndarray) -> np.ndarray:
        """The values at positions ``pos``."""
        run = np.searchsorted(self.starts, pos, side="right") - 1
        return self.values[run] + (np.asarray(pos, dtype=np.int64) - self.starts[run])

    def find(self, values: np.ndarray) -> np.ndarray:
        """The positions holding ``values`` (the runs' values ascending: record indices), -1
        where none does."""
        values = np.asarray(values, dtype=np.int64)
        if not self.n:
            return np.full(len(values), -1, dtype=np.int64)
        run = np.maximum(np.searchsorted(self.values, values, side="right") - 1, 0)
        pos = self.starts[run] + (values - self.values[run])
        ends = np.append(self.starts[1:], self.n)[run]
        return np.where((values >= self.values[run]) & (pos < ends), pos, -1)


@dataclass(frozen=True)
class Outline:
    """What the window needs of one rank's records, kept once the records are let go: their
    leaf collectives, their indices and slots, their point-to-point records and their parents
    (``keep`` picks the rows from this alone), and which exited (to check a second read of the
    rows kept against the first)."""

    n: int  # the rank's records
    leaves: Leaves
    idx: Runs  # the record index at each position
    slots: Runs  # the ring slot at each position
    exited: np.ndarray  # np.packbits of the exited flag per position
    p2p: np.ndarray  # positions of the point-to-point records
    p2p_family: np.ndarray  # and of the records whose parent is one (empty past P2P_WHOLE)
    parented: np.ndarray  # positions of the records with a parent...
    parents: np.ndarray  # ...and its index

    def exited_at(self, pos: np.ndarray) -> np.ndarray:
        return np.unpackbits(self.exited, count=self.n).astype(bool)[pos]


def outline(rows: Columns, exited: np.ndarray, slots: np.ndarray, code: np.ndarray) -> Outline:
    """The ``Outline`` of one rank's records (``rows``, by index: its columns or RECORD rows;
    ``exited`` and ``slots`` per record)."""
    idx = rows["idx"]
    kind, parent = rows["kind"], rows["parent"]
    p2p = np.flatnonzero(kind == int(EventKind.P2P))
    family = np.zeros(0, dtype=np.int64)
    if 0 < len(p2p) <= P2P_WHOLE:
        family = np.flatnonzero(np.isin(parent, idx[p2p]))
    parented = np.flatnonzero(parent != 0)
    return Outline(len(idx), leaves(rows, exited, code), Runs.of(idx), Runs.of(slots),
                   np.packbits(exited), p2p, family, parented,
                   parent[parented].astype(np.int64))


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
        for g, (seq, _pos, key) in by_rank[rank].groups.items():
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


def p2p_whole(rows: Columns, kept: np.ndarray) -> bool:
    """Whether ``kept`` (bool per row) holds every point-to-point record of the rank."""
    return not bool((~kept & (rows["kind"] == int(EventKind.P2P))).any())


def keep(rank: Outline, points: Mapping[int, list[int]], tail: int) -> np.ndarray:
    """bool per record of one rank: the records the passes see. Around each point of each group
    (``MARGIN`` collectives either side): every record between the first and the last of those
    calls; the rank's newest ``tail`` records; every point-to-point record and the waits on
    them, up to ``P2P_WHOLE`` of them (a channel is paired message by message from its first:
    ``p2p_whole``); and the parents of what is kept."""
    mask = np.zeros(rank.n, dtype=bool)
    mask[max(0, rank.n - tail):] = True
    if 0 < len(rank.p2p) <= P2P_WHOLE:
        mask[rank.p2p] = True
        mask[rank.p2p_family] = True
    for g, (seq, pos, _key) in rank.leaves.groups.items():
        for s in points.get(g, ()):
            lo, hi = np.searchsorted(seq, [s - MARGIN, s + MARGIN + 1])
            if hi > lo:
                near = pos[lo:hi]
                mask[near.min():near.max() + 1] = True
    parents = rank.parents[mask[rank.parented]]
    if len(parents):
        at = rank.idx.find(np.unique(parents))
        mask[at[at >= 0]] = True
    return mask


def p2p_kept(rank: Outline, kept: np.ndarray) -> bool:
    """``p2p_whole`` of a rank's ``Outline``."""
    return bool(kept[rank.p2p].all())
