"""Which Flight Recorder entries a diagnosis needs: from a little before the first collective on
which the ranks' dumps disagree (or the first one a rank lacks) to the end.

A timeout dump holds up to 2,000 entries per rank; at 1,024 ranks that is two million entries,
nearly all of them identical on every rank and irrelevant to why the job hung. Finding the first
divergence needs one cheap comparison per entry (op, input sizes and dtypes, per process group
and sequence number); only the entries from there on become events for the analysis passes, which
then see the same divergence, the same last collective of each rank and the same missing calls as
on the whole dumps.
"""

from __future__ import annotations

import bisect
from typing import Any, Mapping

from nccl_doctor.capture.flight_recorder import position

#: Entries kept before the first divergence (context: the call each side made before it).
MARGIN = 4


class _Column:
    """One group's collectives in one dump, in the dump's order: sequence numbers, the compared
    keys (ids of (op, input sizes, input dtypes)) and where each entry sits in the dump."""

    __slots__ = ("seqs", "keys", "index")

    def __init__(self) -> None:
        self.seqs: list[int] = []
        self.keys: list[int] = []
        self.index: list[int] = []


def columns(entries: list, ids: dict[tuple, int]) -> dict[str, _Column]:
    """Per group, the collectives of one dump, placed as the events are
    (``flight_recorder.position``: p2p and malformed entries left out). ``ids`` numbers the
    keys (shared by the dumps compared). The hot loop of a large replay: kept lean."""
    out: dict[str, _Column] = {}
    for i, e in enumerate(entries):
        at = position(e)
        if at is None:
            continue
        try:
            sizes, dtypes = e.get("input_sizes"), e.get("input_dtypes")
            key = (e["profiling_name"], tuple(map(tuple, sizes)) if sizes else (),
                   tuple(dtypes or ()))
        except TypeError:  # sizes that are not lists of lists: the entry is malformed
            continue
        col = out.get(at[0])
        if col is None:
            col = out[at[0]] = _Column()
        col.seqs.append(at[1])
        col.keys.append(ids.setdefault(key, len(ids)))
        col.index.append(i)
    return out


def _first_difference(a: _Column, b: _Column) -> int | None:
    """The lowest sequence number both columns hold with different keys (None: none)."""
    sa, ka = a.seqs, a.keys
    sb, kb = b.seqs, b.keys
    if not sa or not sb:
        return None
    lo, hi = max(sa[0], sb[0]), min(sa[-1], sb[-1])
    if lo > hi:
        return None
    contiguous = sa[-1] - sa[0] + 1 == len(sa) and sb[-1] - sb[0] + 1 == len(sb)
    if contiguous:  # the common case: compare the overlapping slices in one go (C speed)
        xa, xb = ka[lo - sa[0]:hi - sa[0] + 1], kb[lo - sb[0]:hi - sb[0] + 1]
        if xa == xb:
            return None
        return lo + next(i for i, (x, y) in enumerate(zip(xa, xb)) if x != y)
    other = dict(zip(sb, kb))
    for seq, key in zip(sa, ka):
        if seq in other and other[seq] != key:
            return seq
    return None


def starts(all_columns: Mapping[int, Mapping[str, Any]]) -> dict[str, int]:
    """Per process group, the first sequence number to keep (columns: rank -> group -> an
    object with ``seqs`` and ``keys``)."""
    groups = {g for cols in all_columns.values() for g in cols}
    out = {}
    for group in groups:
        ranks = [r for r in sorted(all_columns)
                 if group in all_columns[r] and all_columns[r][group].seqs]
        if not ranks:
            continue
        ref = all_columns[ranks[0]][group]
        first = min(all_columns[r][group].seqs[-1] for r in ranks)  # a rank's last: missing after
        for r in ranks[1:]:
            diff = _first_difference(ref, all_columns[r][group])
            if diff is not None:
                first = min(first, diff)
        out[group] = first - MARGIN
    return out


def cut(dump: Mapping[str, Any], cols: Mapping[str, _Column], start_of: Mapping[str, int]
        ) -> dict[str, Any]:
    """``dump`` with only its collectives from each group's start on."""
    entries = dump.get("entries") or []
    keep: list[int] = []
    for group, col in cols.items():
        start, seqs = start_of.get(group), col.seqs
        if start is None:
            keep.extend(col.index)
        elif all(x <= y for x, y in zip(seqs, seqs[1:])):  # in order: cut at the start
            keep.extend(col.index[bisect.bisect_left(seqs, start):])
        else:
            keep.extend(i for i, q in zip(col.index, seqs) if q >= start)
    keep.sort()
    return {**dump, "entries": [entries[i] for i in keep]}


def trim(by_rank: Mapping[int, Mapping[str, Any]]) -> tuple[dict[int, dict[str, Any]], int, int]:
    """(the dumps with only the collectives from each group's window start on, entries kept,
    entries in all)."""
    ids: dict[tuple, int] = {}
    cols = {r: columns(d.get("entries") or [], ids) for r, d in by_rank.items()}
    start_of = starts(cols)
    out = {r: cut(d, cols[r], start_of) for r, d in by_rank.items()}
    kept = sum(len(d["entries"]) for d in out.values())
    total = sum(len(d.get("entries") or []) for d in by_rank.values())
    return out, kept, total
