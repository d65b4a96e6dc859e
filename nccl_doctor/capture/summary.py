"""A rank's capture in brief: what one node's supervisor tells the others about each of its ranks
(nccl_doctor/supervisor/federation/). Pure, JSON-safe, and bounded whatever the capture holds:
the last ``TAIL`` calls plus each group's last call, and the last few notes of each kind (the
group layouts, the seeding calls, the generation hashes and metrics the silent passes compare,
the exit). Analysis passes read a summary's ``RankTrace`` as they read a ring that wrapped.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any, Mapping, Sequence

from nccl_doctor.location import Location
from nccl_doctor.model import (
    Event, EventFlag, EventKind, EventSource, EventState, ExitKind, Integrity, RankExit,
    RankMeta, RankTrace,
)

FORMAT = 1
#: The calls a summary keeps per rank (the newest), besides each process group's last call.
TAIL = 48
#: Most process groups whose last call is kept beyond the tail.
GROUPS = 32
#: Notes kept per kind (the newest); kinds not named here keep ``NOTES_DEFAULT``.
NOTES_KEPT = {"group": 256, "gen": 32, "rng": 32, "seed": 32, "metrics": 32}
NOTES_DEFAULT = 8


def _loc(loc: Location | None) -> list | None:
    return None if loc is None else [loc.path, loc.line, loc.function]


def _unloc(raw: Any) -> Location | None:
    if not isinstance(raw, list) or len(raw) != 3:
        return None
    return Location(str(raw[0]), int(raw[1]), str(raw[2]))


def _event(e: Event) -> list:
    return [e.idx, e.parent, int(e.kind), e.op, e.group, e.seq, e.seq_offset, e.seq_delta,
            int(e.state), int(e.flags), e.t_enter_ns, e.t_exit_ns, e.thread, e.input, e.output,
            e.nbytes, e.peer, e.group_size, _loc(e.callsite), _loc(e.api_callsite), e.extra,
            e.source.value, e.in_flight]


def _unevent(raw: Sequence[Any]) -> Event:
    (idx, parent, kind, op, group, seq, seq_offset, seq_delta, state, flags, t_enter, t_exit,
     thread, inp, out, nbytes, peer, group_size, callsite, api_callsite, extra, source,
     in_flight) = raw
    return Event(
        int(idx), int(parent), EventKind(kind), str(op), str(group), int(seq), int(seq_offset),
        None if seq_delta is None else int(seq_delta), EventState(state), EventFlag(flags),
        int(t_enter), None if t_exit is None else int(t_exit), int(thread), str(inp), str(out),
        int(nbytes), int(peer), int(group_size), _unloc(callsite), _unloc(api_callsite),
        str(extra), EventSource(source), bool(in_flight))


def kept_events(events: Sequence[Event], tail: int = TAIL) -> list[Event]:
    """The newest ``tail`` calls, each group's last call before them, and the records that
    enclose the kept calls (an object collective around its all_gather)."""
    keep = {e.idx: e for e in events[-tail:]} if tail else {}
    last: dict[str, Event] = {}
    for e in events:
        if e.group:
            last[e.group] = e
    for e in sorted(last.values(), key=lambda e: e.idx)[-GROUPS:]:
        keep.setdefault(e.idx, e)
    by_idx = None
    for e in list(keep.values()):
        if e.parent and e.parent not in keep:
            by_idx = by_idx or {x.idx: x for x in events}
            parent = by_idx.get(e.parent)
            if parent is not None:
                keep[parent.idx] = parent
    return sorted(keep.values(), key=lambda e: e.idx)


def kept_notes(notes: Sequence[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    """The newest notes of each kind, in their order; a rank's seeding calls are kept apart
    from its per-step RNG notes, so a long job keeps the call that seeded it."""
    by_kind: dict[str, list[int]] = defaultdict(list)
    for i, n in enumerate(notes):
        kind = str(n.get("note"))
        if kind == "rng" and n.get("label") not in ("init", "step"):
            kind = "rng:seeding"
        by_kind[kind].append(i)
    keep: set[int] = set()
    for kind, idx in by_kind.items():
        keep.update(idx[-NOTES_KEPT.get(kind.split(":")[0], NOTES_DEFAULT):])
    return [notes[i] for i in sorted(keep)]


def summarize(trace: RankTrace, tail: int = TAIL) -> dict[str, Any]:
    """``trace`` in brief (JSON-safe)."""
    m, ex, i = trace.meta, trace.exit, trace.integrity
    events = kept_events(trace.events, tail)
    return {
        "meta": {"rank": m.rank, "world_size": m.world_size, "local_rank": m.local_rank,
                 "node_rank": m.node_rank, "host": m.host, "pid": m.pid,
                 "started_ns": m.started_ns, "run_id": m.run_id, "argv": list(m.argv)[:8],
                 "versions": dict(m.versions), "env": dict(m.env)},
        "events": [_event(e) for e in events],
        "dropped": len(trace.events) - len(events),
        "exit": {"kind": ex.kind.value, "code": ex.code, "signal": ex.signal,
                 "exception": ex.exception, "callsite": _loc(ex.callsite), "time_ns": ex.time_ns},
        "integrity": [i.torn_records, i.truncated, i.overwritten, i.bad_strings],
        "path": trace.path,
        "notes": kept_notes(trace.notes),
    }


def unsummarize(raw: Mapping[str, Any]) -> RankTrace:
    """The ``RankTrace`` of a summary (``ValueError`` when it is not one)."""
    try:
        m, ex = raw["meta"], raw["exit"]
        meta = RankMeta(
            rank=int(m["rank"]), world_size=int(m.get("world_size") or 0),
            local_rank=m.get("local_rank"), node_rank=m.get("node_rank"),
            host=str(m.get("host", "")), pid=int(m.get("pid") or 0),
            started_ns=int(m.get("started_ns") or 0), run_id=str(m.get("run_id", "")),
            argv=tuple(str(a) for a in m.get("argv", ())),
            versions={str(k): str(v) for k, v in (m.get("versions") or {}).items()},
            env={str(k): str(v) for k, v in (m.get("env") or {}).items()})
        exit_ = RankExit(ExitKind(ex["kind"]), ex.get("code"), ex.get("signal"),
                         ex.get("exception"), _unloc(ex.get("callsite")), ex.get("time_ns"))
        torn, truncated, overwritten, bad = raw.get("integrity") or (0, False, 0, 0)
        return RankTrace(
            meta=meta, events=tuple(_unevent(e) for e in raw.get("events", ())), exit=exit_,
            integrity=Integrity(int(torn), bool(truncated), int(overwritten), int(bad)),
            path=str(raw.get("path", "")),
            notes=tuple(n for n in raw.get("notes", ()) if isinstance(n, dict)))
    except (KeyError, TypeError, ValueError) as err:
        raise ValueError(f"not a rank summary ({err!r})") from None
