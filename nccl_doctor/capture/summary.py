"""A rank's capture in brief: what one node's supervisor tells the others about each of its ranks
(nccl_doctor/supervisor/federation/). Pure, JSON-safe, and bounded whatever the capture holds:
the last ``TAIL`` calls plus each group's last call, and the last few notes of each kind (the
group layouts, the seeding calls, the generation hashes and metrics the silent passes compare,
the exit). Analysis passes read a summary's ``RankTrace`` as they read a ring that wrapped.

A **digest** (``digest``) is smaller still, and constant per rank: each group's last call (the
one the rank waits in, or the last it completed: the sequence numbers entered and completed),
the layouts of those groups, the rank's end, and per group the calls and time waited among its
last ``WAITS`` calls (the lateness window: the last rank to arrive waits the least). A node at
scale sends digests when its ranks go quiet; the leader fetches full summaries only from the
nodes the digests make suspect (federation/leader.py). ``unsummarize`` reads both.
"""

from __future__ import annotations

import functools
from collections import defaultdict
from dataclasses import fields
from typing import Any, Mapping, Sequence

from nccl_doctor import paths
from nccl_doctor.location import Location
from nccl_doctor.model import (
    Event, EventFlag, EventKind, EventSource, EventState, ExitKind, Integrity, RankExit,
    RankMeta, RankTrace,
)

FORMAT = 1
#: The calls a summary keeps per rank (the newest), besides each process group's last call.
TAIL = 24
#: Most process groups whose last call is kept beyond the tail.
GROUPS = 32
#: Notes kept per kind (the newest); kinds not named here keep ``NOTES_DEFAULT``.
NOTES_KEPT = {"group": 256, "gen": 32, "rng": 32, "seed": 32, "metrics": 32}
NOTES_DEFAULT = 8


class _Sites:
    """A summary's table of source locations (a rank calls from a handful of lines)."""

    def __init__(self) -> None:
        self.rows: list[list] = []
        self._index: dict[tuple[Location, bool, bool], int] = {}

    def __call__(self, loc: Location | None) -> int:
        if loc is None:
            return -1
        key = (loc, loc.passes_on, loc.from_torch)  # (the flags are not part of the place)
        i = self._index.get(key)
        if i is None:
            i = self._index[key] = len(self.rows)
            flags = ("p" if loc.passes_on else "") + ("t" if loc.from_torch else "")
            self.rows.append([loc.path, loc.line, loc.function] + ([flags] if flags else []))
        return i


def _loc(loc: Location | None) -> list | None:
    return None if loc is None else [loc.path, loc.line, loc.function]


def _unloc(raw: Any) -> Location | None:
    if not isinstance(raw, list) or len(raw) not in (3, 4):
        return None
    flags = str(raw[3]) if len(raw) == 4 else ""
    return Location(str(raw[0]), int(raw[1]), str(raw[2]), passes_on="p" in flags,
                    from_torch="t" in flags)


def _event(e: Event, site: _Sites) -> list:
    return [e.idx, e.parent, int(e.kind), e.op, e.group, e.seq, e.seq_offset, e.seq_delta,
            int(e.state), int(e.flags), e.t_enter_ns, e.t_exit_ns, e.thread, e.input, e.output,
            e.nbytes, e.peer, e.group_size, site(e.callsite), site(e.api_callsite),
            [site(loc) for loc in e.path],
            e.source.value, e.in_flight, e.t_gpu_start_ns, e.context, e.t_gpu_end_ns]


_KINDS = {int(k): k for k in EventKind}
_STATES = {int(k): k for k in EventState}
_SOURCES = {k.value: k for k in EventSource}


_FIELDS = tuple(f.name for f in fields(Event))
_INTS = (0, 1, 5, 6, 10, 12, 15, 16, 17)  # positions of the plain integers in a packed event


def _unevent(raw: Sequence[Any], sites: list[Location | None]) -> Event:
    """A packed event back. The leader reads thousands of ranks at once: the frozen
    dataclass's field-by-field __init__ is skipped (its values checked here instead)."""
    if len(raw) == len(_FIELDS) - 1:  # a follower of the version before t_gpu_end_ns
        raw = [*raw, None]
    if len(raw) != len(_FIELDS) or not all(type(raw[i]) is int for i in _INTS):
        raise ValueError("not a packed event")
    values = list(raw)
    values[2], values[8], values[21] = _KINDS[raw[2]], _STATES[raw[8]], _SOURCES[raw[21]]
    values[9] = EventFlag(raw[9]) if raw[9] else EventFlag.NONE
    values[18] = sites[raw[18]] if raw[18] >= 0 else None
    values[19] = sites[raw[19]] if raw[19] >= 0 else None
    if not isinstance(raw[20], list) or not all(type(i) is int and i >= 0 for i in raw[20]):
        raise ValueError("not a packed event")
    values[20] = tuple(loc for loc in (sites[i] for i in raw[20]) if loc is not None)
    values[22] = bool(raw[22])
    if raw[23] is not None and type(raw[23]) is not int or type(raw[24]) is not str:
        raise ValueError("not a packed event")
    if raw[25] is not None and type(raw[25]) is not int:
        raise ValueError("not a packed event")
    event = object.__new__(Event)
    event.__dict__.update(zip(_FIELDS, values))
    return event


def _pack_ranks(ranks: Any) -> Any:
    """A long contiguous rank list as [first, last + 1] (a world group of 8,192 ranks)."""
    if (isinstance(ranks, list) and len(ranks) > 16 and all(isinstance(r, int) for r in ranks)
            and ranks == list(range(ranks[0], ranks[0] + len(ranks)))):
        return {"range": [ranks[0], ranks[0] + len(ranks)]}
    return ranks


def _unpack_ranks(ranks: Any) -> Any:
    if isinstance(ranks, dict) and isinstance(ranks.get("range"), list):
        first, stop = ranks["range"]
        return _ranks(int(first), int(stop))
    return ranks


@functools.lru_cache(maxsize=64)
def _ranks(first: int, stop: int) -> list[int]:
    """One list per range, shared by every rank's note (a world group of 8,192 ranks is in
    every rank's summary). Read only."""
    return list(range(first, stop))


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


#: Source fingerprints a summary carries per rank (the user's files first): the leader reads
#: the branch on the rank from them; a node's summary stays O(its ranks) per look.
SOURCES = 64


def _sources(sources: Mapping[str, str]) -> dict[str, str]:
    ordered = sorted(sources, key=lambda p: (paths.is_library_file(p), p))
    return {p: sources[p] for p in ordered[:SOURCES]}


def summarize(trace: RankTrace, tail: int = TAIL) -> dict[str, Any]:
    """``trace`` in brief (JSON-safe)."""
    m, ex, i = trace.meta, trace.exit, trace.integrity
    events = kept_events(trace.events, tail)
    site = _Sites()
    packed = [_event(e, site) for e in events]
    notes = [{**n, "ranks": _pack_ranks(n["ranks"])} if n.get("note") == "group" and "ranks" in n
             else n for n in kept_notes(trace.notes)]
    return {
        "meta": {"rank": m.rank, "world_size": m.world_size, "local_rank": m.local_rank,
                 "node_rank": m.node_rank, "host": m.host, "pid": m.pid,
                 "started_ns": m.started_ns, "run_id": m.run_id, "argv": list(m.argv)[:8],
                 "versions": dict(m.versions), "env": dict(m.env), "ray": dict(m.ray),
                 "sources": _sources(m.sources), "prefixes": list(m.prefixes)},
        "sites": site.rows, "events": packed,
        "dropped": len(trace.events) - len(events),
        "exit": {"kind": ex.kind.value, "code": ex.code, "signal": ex.signal,
                 "exception": ex.exception, "callsite": _loc(ex.callsite), "time_ns": ex.time_ns},
        "integrity": [i.torn_records, i.truncated, i.overwritten, i.bad_strings],
        "path": trace.path, "paths_recorded": trace.paths_recorded,
        "notes": notes,
    }


#: A digest's lateness window: a rank's last calls, whose time waited is summed per group.
WAITS = 64
#: The notes a digest keeps: the layouts of the groups its calls name, and the rank's end.
_DIGEST_NOTES = ("destroyed", "exit")
_NOT_BLOCKING = EventFlag.ASYNC | EventFlag.COALESCED


def digest(trace: RankTrace) -> dict[str, Any]:
    """``trace`` in digest (JSON-safe, read back by ``unsummarize``): no call beyond each
    group's last, none of the identity a report's header reads (versions, environment, source
    fingerprints), and a ``waits`` note: group -> [calls completed, ns waited in them] among the
    last ``WAITS`` calls."""
    full = summarize(trace, tail=0)
    groups = {e[4] for e in full["events"]}
    full["notes"] = [n for n in full["notes"] if n.get("note") in _DIGEST_NOTES
                     or n.get("note") == "group" and n.get("name") in groups]
    m = full["meta"]
    full["meta"] = {k: m[k] for k in ("rank", "world_size", "local_rank", "node_rank", "host",
                                      "pid", "started_ns", "run_id")}
    waits: dict[str, list[int]] = {}
    for e in trace.events[-WAITS:]:
        if not e.group or e.flags & _NOT_BLOCKING:
            continue
        if e.t_gpu_start_ns and e.t_gpu_end_ns:  # NCCL: the kernel's time (a call returns
            waited = e.t_gpu_end_ns - e.t_gpu_start_ns  # once enqueued)
        elif e.t_exit_ns is not None and not e.in_flight:
            waited = e.t_exit_ns - e.t_enter_ns
        else:
            continue
        w = waits.setdefault(e.group, [0, 0])
        w[0] += 1
        w[1] += max(0, waited)
    full["notes"].append({"note": "waits", "groups": waits})  # (analysis/slow/waits.py)
    full["digest"] = True
    for k in ("dropped", "paths_recorded"):
        del full[k]
    if trace.exit.kind is ExitKind.RUNNING:
        del full["exit"]  # (read back as running)
    return full


def unsummarize(raw: Mapping[str, Any]) -> RankTrace:
    """The ``RankTrace`` of a summary (``ValueError`` when it is not one)."""
    try:
        m, ex = raw["meta"], raw.get("exit") or {"kind": ExitKind.RUNNING.value}
        meta = RankMeta(
            rank=int(m["rank"]), world_size=int(m.get("world_size") or 0),
            local_rank=m.get("local_rank"), node_rank=m.get("node_rank"),
            host=str(m.get("host", "")), pid=int(m.get("pid") or 0),
            started_ns=int(m.get("started_ns") or 0), run_id=str(m.get("run_id", "")),
            argv=tuple(str(a) for a in m.get("argv", ())),
            versions={str(k): str(v) for k, v in (m.get("versions") or {}).items()},
            env={str(k): str(v) for k, v in (m.get("env") or {}).items()},
            ray={str(k): str(v) for k, v in (m.get("ray") or {}).items()},
            sources={str(k): str(v) for k, v in (m.get("sources") or {}).items()},
            prefixes=tuple(str(p) for p in m.get("prefixes") or ()))
        exit_ = RankExit(ExitKind(ex["kind"]), ex.get("code"), ex.get("signal"),
                         ex.get("exception"), _unloc(ex.get("callsite")), ex.get("time_ns"))
        torn, truncated, overwritten, bad = raw.get("integrity") or (0, False, 0, 0)
        sites = [_unloc(row) for row in raw.get("sites", ())]
        notes = tuple({**n, "ranks": _unpack_ranks(n["ranks"])} if "ranks" in n else n
                      for n in raw.get("notes", ()) if isinstance(n, dict))
        return RankTrace(
            meta=meta, events=tuple(_unevent(e, sites) for e in raw.get("events", ())),
            exit=exit_,
            integrity=Integrity(int(torn), bool(truncated), int(overwritten), int(bad)),
            path=str(raw.get("path", "")), notes=notes,
            paths_recorded=bool(raw.get("paths_recorded", True)))
    except (KeyError, TypeError, ValueError, IndexError) as err:
        raise ValueError(f"not a rank summary ({err!r})") from None
