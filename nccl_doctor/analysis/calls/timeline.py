"""The ranks' collective timeline: a pure pass from a TraceSet (and its diagnosis) to what the
HTML report draws - per process group, the last collectives by sequence number, one row per rank
(ranks whose rows are identical folded into one, STAT-style, past ``FOLD_ABOVE`` ranks), each cell
the call a rank made at that number, its state, and whether it differs from the majority there.

The window ends just past the root cause's sequence number when the root cause names one (so the
divergence is in view with the calls that led to it), else at the last number any rank reached.
"""

from __future__ import annotations

from collections import Counter

from nccl_doctor.diagnosis import Diagnosis
from nccl_doctor.model import Event, EventKind, EventState, TraceSet
from nccl_doctor.page_model import Cell, Lane, Row, Timeline

#: Columns per group: the sequence numbers shown.
WIDTH = 24
#: Up to this many ranks every rank has its row; past it identical rows are folded.
FOLD_ABOVE = 16
#: Groups drawn (the root cause's first, then the busiest).
MAX_GROUPS = 4

_STATE = {EventState.RETURNED: "returned", EventState.ENTERED: "entered",
          EventState.FAILED: "failed", EventState.ISSUED: "issued"}


def timeline(traces: TraceSet, diagnosis: Diagnosis | None = None) -> Timeline:
    root = diagnosis.root_cause if diagnosis is not None else None
    culprits = frozenset(root.ranks) if root is not None else frozenset()
    calls = _calls_by_group(traces)
    order = sorted(calls, key=lambda g: (g != (root.group if root else None),
                                         -max((max(s) for s in calls[g].values() if s),
                                              default=0), g))
    lanes = []
    for group in order[:MAX_GROUPS]:
        focus = root.seq if root is not None and root.group == group else None
        lanes.append(_lane(group, calls[group], traces.group_members(group), focus, culprits))
    return Timeline(tuple(lane for lane in lanes if lane.seqs), traces.world_size)


def _calls_by_group(traces: TraceSet) -> dict[str, dict[int, dict[int, Event]]]:
    """group -> rank -> seq -> the rank's collective at that number (the newest WIDTH*2 per
    rank and group: the window never reaches further back)."""
    out: dict[str, dict[int, dict[int, Event]]] = {}
    for rank, trace in traces.ranks.items():
        kept: dict[str, dict[int, Event]] = {}
        for event in reversed(trace.events):
            if event.kind is not EventKind.COLLECTIVE or event.seq < 0 or event.is_composite:
                continue
            seqs = kept.setdefault(event.group, {})
            if len(seqs) >= 2 * WIDTH:
                continue
            seqs.setdefault(event.seq, event)
        for group, seqs in kept.items():
            out.setdefault(group, {})[rank] = seqs
    return out


def _lane(group: str, by_rank: dict[int, dict[int, Event]], members: tuple[int, ...],
          focus: int | None, culprits: frozenset[int]) -> Lane:
    reached = [s for seqs in by_rank.values() for s in seqs]
    if not reached:
        return Lane(group, (), (), None, 0, False)
    last = max(reached)
    end = min(last, focus + 2) if focus is not None else last
    start = max(min(reached), end - WIDTH + 1)
    seqs = tuple(range(start, end + 1))
    majority = {s: _majority(by_rank, s) for s in seqs}
    called = {s for s in seqs if any(s in mine for mine in by_rank.values())}
    ranks = sorted(set(members) | set(by_rank))
    rows = []
    for rank in ranks:
        mine = by_rank.get(rank, {})
        furthest = max(mine, default=-1)
        cells = []
        short = False
        for s in seqs:
            event = mine.get(s)
            if event is None:
                short = short or (s > furthest and s in called)
                cells.append(None)
                continue
            cells.append(Cell(event.op, event.input, _STATE[event.state], event.where,
                              odd=(event.op, event.input) != majority[s]))  # (no majority: odd)
        rows.append(Row((rank,), tuple(cells), short or any(c and c.odd for c in cells),
                        rank in culprits))
    fold = len(rows) > FOLD_ABOVE
    if fold:
        rows = _fold(rows)
    return Lane(group, seqs, tuple(rows), focus if focus in seqs else None,
                max(0, start - min(reached)), fold)


def _majority(by_rank: dict[int, dict[int, Event]], seq: int) -> tuple[str, str] | None:
    """The call most ranks made at ``seq`` ((op, input)); None when no call has more votes
    than every other (two ranks that differ: both sides are marked)."""
    votes = Counter((seqs[seq].op, seqs[seq].input) for seqs in by_rank.values() if seq in seqs)
    top = votes.most_common(2)
    if not top or (len(top) == 2 and top[0][1] == top[1][1]):
        return None
    return top[0][0]


def _fold(rows: list[Row]) -> list[Row]:
    """Rows with the same cells (callsites aside) as one row of their ranks, in rank order."""
    folded: dict[tuple, Row] = {}
    for row in rows:
        key = (tuple((c.op, c.shape, c.state, c.odd) if c else None for c in row.cells),
               row.culprit)
        seen = folded.get(key)
        folded[key] = row if seen is None else Row(seen.ranks + row.ranks, seen.cells,
                                                   seen.odd, seen.culprit)
    return sorted(folded.values(), key=lambda r: r.ranks[0])
