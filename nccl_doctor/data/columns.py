"""Recorded calls as columns (pure): one row per collective or point-to-point call a rank made.

Two sources make the same columns:

- ``scan_columns``: a capture read as columns (capture/follow.py ``Scan``). Every field comes
  from the numpy record rows in bulk; a string (op, group, a callsite) is looked up once per
  distinct id of the rank, never once per record - no Python object per call.
- ``trace_columns``: a rank's typed events (Flight Recorder dumps, or calls merged from them),
  one Python step per event: what has no capture.

Text columns are categorical: each ``Categories`` interns its strings across every rank, so the
ranks' columns concatenate as integer codes and one ``pandas.Categorical`` holds them all.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable, Mapping

import numpy as np
import pandas as pd

from nccl_doctor import call_path
from nccl_doctor.capture.follow import Scan, scan_capture
from nccl_doctor.capture.records import _call_path
from nccl_doctor.errors import DoctorError
from nccl_doctor.location import Location
from nccl_doctor.model import EventFlag, EventKind, EventSource, EventState, RankTrace

#: The columns of ``calls``, in order, and what each holds (docs/python-api.md says the same).
COLUMNS: dict[str, str] = {
    "rank": "global rank that made the call",
    "host": "host the rank ran on",
    "pid": "the rank's process id",
    "group": "process group name (PyTorch's group_name; '0' is the default group)",
    "seq": "the call's number among its group's collectives, as reports say it (#N); -1 unknown",
    "torch_seq": "PyTorch's own per-group sequence number (p2p calls bump it too); -1 unknown",
    "op": "all_reduce, all_gather_into_tensor, broadcast, send, ...",
    "kind": "collective or p2p",
    "input": "input tensor description, e.g. float32[2,7,32] (4*... for a uniform list)",
    "output": "output tensor description",
    "nbytes": "bytes of the call's input tensors",
    "peer": "root of a rooted collective or a p2p peer, as a global rank; -1 none",
    "group_size": "members of the group",
    "t_enter": "when the rank entered the call (UTC)",
    "t_exit": "when it returned (UTC); NaT: no exit (still inside, died there, or a Flight "
              "Recorder entry whose work did not complete)",
    "duration_s": "t_exit - t_enter in seconds; NaN without an exit",
    "state": "returned, entered (no exit), failed (raised) or issued (async: see its wait)",
    "in_flight": "returned on the CPU, but Flight Recorder shows its work not completed: the "
                 "rank waits in it (state reads entered; with fr= or the watchdog's pulls)",
    "async": "called with async_op=True (or isend/irecv)",
    "composite": "a wrapper around other recorded calls (object collectives)",
    "callsite": "the user's line (first frame outside torch and the libraries that wrap it)",
    "function": "the function of that line",
    "api_callsite": "the direct caller of the torch.distributed API",
    "issuing": "the line that decided to make the call (a library's, else the user's)",
    "thread": "the calling thread's id",
    "idx": "the record's number in the rank's capture (1-based); a Flight Recorder entry "
           "no rank recorded: 10**12 + its record_id",
    "parent": "idx of the enclosing recorded call (object collective, async op); 0 none",
    "source": "recorder (the Python API, in the capture), functional (the functional "
              "collectives: DTensor, tensor parallel, compiled graphs, in the capture) or "
              "flight_recorder (PyTorch's Flight Recorder)",
}

#: Categorical columns (their values interned across ranks).
TEXT = ("host", "group", "op", "kind", "input", "output", "state", "callsite", "function",
        "api_callsite", "issuing", "source")
_KIND_NAME = {int(EventKind.COLLECTIVE): "collective", int(EventKind.P2P): "p2p"}
_STATE_NAME = {int(s): s.name.lower() for s in EventState}
_CALLS = np.array(sorted(_KIND_NAME), dtype=np.uint8)
_NAT = np.iinfo(np.int64).min  # numpy's NaT as int64
#: the dtype of each column that is not int32, for a table of no call (the same schema)
_EMPTY = {"pid": np.int64, "seq": np.int64, "torch_seq": np.int64, "nbytes": np.int64,
          "t_enter": np.int64, "t_exit": np.int64, "duration_s": np.float64, "in_flight": bool,
          "async": bool, "composite": bool, "thread": np.int64, "idx": np.int64,
          "parent": np.int64}


def _sources(flags: np.ndarray, cats: "Categories") -> np.ndarray:
    """The capture's rows' source codes: recorder, or functional where the flag says so."""
    out = np.full(len(flags), cats.code(EventSource.RECORDER.value), dtype=np.int32)
    functional = (flags & int(EventFlag.FUNCTIONAL)) != 0
    if functional.any():
        out[functional] = cats.code(EventSource.FUNCTIONAL.value)
    return out


@dataclass
class Categories:
    """A text column's values, interned: value -> code, and the values by code."""

    values: list[str] = field(default_factory=list)
    _codes: dict[str, int] = field(default_factory=dict)

    def code(self, value: str | None) -> int:
        if value is None:
            return -1
        code = self._codes.get(value)
        if code is None:
            code = self._codes[value] = len(self.values)
            self.values.append(value)
        return code

    def lookup(self, ids: np.ndarray, text: Mapping[int, str],
               missing: str | None = None) -> np.ndarray:
        """Codes for ``ids`` (one rank's string ids; an id ``text`` lacks reads ``missing``),
        each distinct id looked up once."""
        if not len(ids):
            return np.zeros(0, dtype=np.int32)
        inverse, uniq = pd.factorize(ids)  # hashed, not sorted: O(rows)
        table = np.array([self.code(text.get(int(i), missing)) for i in uniq], dtype=np.int32)
        return table[inverse]


def categories() -> dict[str, Categories]:
    """A fresh set of interners, one per text column: share it across the ranks of one table."""
    return {name: Categories() for name in TEXT}


def capture_columns(path: Path) -> tuple[Columns, dict[str, Categories]] | None:
    """One capture file's calls, its text columns coded into interners of its own (made
    anywhere: a worker; ``recoded`` puts them into the table's). None: it cannot be read."""
    try:
        scan = scan_capture(path)
    except DoctorError:
        return None
    own = categories()
    return scan_columns(scan, own), own


def in_flight(part: Columns, idx: set[int], cats: Mapping[str, Categories]) -> Columns:
    """``part`` (in ``cats``' codes) with the calls numbered ``idx`` made what Flight Recorder
    says they are: still in flight, the rank inside them (capture/flight_recorder.py)."""
    if not idx or not len(part["idx"]):
        return part
    at = np.isin(part["idx"], np.fromiter(idx, dtype=np.int64, count=len(idx)))
    out = dict(part)
    out["state"] = np.where(at, cats["state"].code("entered"), part["state"]).astype(np.int32)
    out["in_flight"] = part["in_flight"] | at
    out["t_exit"] = np.where(at, _NAT, part["t_exit"])
    out["duration_s"] = np.where(at, np.nan, part["duration_s"])
    return out


def recoded(part: Columns, own: Mapping[str, Categories],
            cats: Mapping[str, Categories]) -> Columns:
    """``part`` with its text codes (into ``own``) made codes into ``cats``."""
    out = dict(part)
    for name in TEXT:
        table = np.array([cats[name].code(v) for v in own[name].values] + [-1], dtype=np.int32)
        out[name] = table[part[name]]  # (-1, no value, picks the -1 appended)
    return out


Columns = dict[str, np.ndarray]


def scan_columns(scan: Scan, cats: Mapping[str, Categories]) -> Columns:
    """The calls of one capture read as columns (text columns as codes into ``cats``)."""
    d = scan.decoded
    keep = np.isin(d.rows["kind"], _CALLS)
    rows, exited = d.rows[keep], d.exited[keep]
    n = len(rows)
    strings = scan.strings
    get = strings.get
    meta = scan.meta
    seq = rows["seq"].astype(np.int64)
    t_enter = rows["t_enter"].astype(np.int64)
    t_exit = np.where(exited, rows["t_exit"].astype(np.int64), _NAT)
    duration = np.where(exited, (t_exit - t_enter) / 1e9, np.nan)
    flags = rows["flags"]
    out: Columns = {
        "rank": np.full(n, meta.rank, dtype=np.int32),
        "host": np.full(n, cats["host"].code(meta.host), dtype=np.int32),
        "pid": np.full(n, meta.pid, dtype=np.int64),
        "group": cats["group"].lookup(rows["group"], strings, "<?>"),
        "seq": np.where(seq >= 0, seq - rows["seq_offset"].astype(np.int64), -1),
        "torch_seq": seq,
        "op": cats["op"].lookup(rows["op"], strings, "<?>"),
        "kind": cats["kind"].lookup(rows["kind"], _KIND_NAME),
        "input": cats["input"].lookup(rows["input"], strings, ""),
        "output": cats["output"].lookup(rows["output"], strings, ""),
        "nbytes": rows["nbytes"].astype(np.int64),
        "peer": rows["peer"].astype(np.int32),
        "group_size": rows["group_size"].astype(np.int32),
        "t_enter": t_enter,
        "t_exit": t_exit,
        "duration_s": duration,
        "state": cats["state"].lookup(np.where(exited, rows["state"], int(EventState.ENTERED)),
                                      _STATE_NAME),
        "in_flight": np.zeros(n, dtype=bool),
        "async": (flags & int(EventFlag.ASYNC)) != 0,
        "composite": (flags & int(EventFlag.COMPOSITE)) != 0,
        "thread": rows["thread"].astype(np.int64),
        "idx": rows["idx"].astype(np.int64),
        "parent": rows["parent"].astype(np.int64),
        "source": _sources(flags, cats["source"]),
    }
    ufile, uline, ufunc = rows["ufile"], rows["uline"], rows["ufunc"]
    afile, aline = rows["afile"], rows["aline"]
    path = rows["path"] if scan.paths else np.zeros(n, dtype=np.uint32)
    # the places, each distinct (file, line[, path]) made once
    inverse, uniq = _distinct([ufile, uline, ufunc, afile, aline, path])
    made: dict[str, list[int]] = {"callsite": [], "function": [], "api_callsite": [],
                                  "issuing": []}
    for uf, ul, ufn, af, al, p in uniq:
        user = Location(get(uf, "<?>"), ul, get(ufn, "")) if uf else None
        api = Location(get(af, "<?>"), al) if af else None
        frames = _call_path(get(p), get) if p else ()
        made["callsite"].append(cats["callsite"].code(str(user) if user else None))
        made["function"].append(cats["function"].code(user.function if user else None))
        made["api_callsite"].append(cats["api_callsite"].code(str(api) if api else None))
        made["issuing"].append(cats["issuing"].code(_issuing(frames, user, api)))
    for name, codes in made.items():
        out[name] = np.array(codes, dtype=np.int32)[inverse] if n else np.zeros(0, np.int32)
    return out


def _distinct(cols: list[np.ndarray]) -> tuple[np.ndarray, list[tuple[int, ...]]]:
    """(row -> the number of its distinct tuple, the distinct tuples) of the columns' rows, by
    hashing (no sort): each column factorised, the codes mixed into one key, factorised."""
    if not len(cols[0]):
        return np.zeros(0, dtype=np.int64), []
    key = np.zeros(len(cols[0]), dtype=np.int64)
    span = 1
    for col in cols:
        codes, values = pd.factorize(col)
        span *= max(len(values), 1)
        if span >= 1 << 62:  # (never in practice: a rank's distinct places are few)
            rows = np.stack(cols, axis=1).astype(np.int64)
            uniq, inverse = np.unique(rows, axis=0, return_inverse=True)
            return inverse.reshape(-1), [tuple(r) for r in uniq.tolist()]
        key = key * max(len(values), 1) + codes
    inverse, keys = pd.factorize(key)
    at = np.zeros(len(keys), dtype=np.int64)
    at[inverse] = np.arange(len(inverse))  # a row of each distinct tuple
    return inverse, [tuple(int(c[i]) for c in cols) for i in at.tolist()]


def _issuing(frames: tuple[Location, ...], user: Location | None,
             api: Location | None) -> str | None:
    """``Event.issuing`` as text (nccl_doctor/call_path.py), else the user's line, else the
    API's caller."""
    place = call_path.issuing(frames, user) or api
    return str(place) if place else None


def trace_columns(trace: RankTrace, cats: Mapping[str, Categories]) -> Columns:
    """The calls among one rank's typed events, as the same columns."""
    calls = [e for e in trace.events if e.kind in (EventKind.COLLECTIVE, EventKind.P2P)]
    meta = trace.meta
    n = len(calls)

    def text(name: str, values: Iterable[str | None]) -> np.ndarray:
        return np.fromiter((cats[name].code(v) for v in values), dtype=np.int32, count=n)

    def ints(values: Iterable[int], dtype: type = np.int64) -> np.ndarray:
        return np.fromiter(values, dtype=dtype, count=n)

    t_exit = ints(e.t_exit_ns if e.done and e.t_exit_ns is not None else _NAT for e in calls)
    t_enter = ints(e.t_enter_ns for e in calls)
    return {
        "rank": np.full(n, meta.rank, dtype=np.int32),
        "host": np.full(n, cats["host"].code(meta.host), dtype=np.int32),
        "pid": np.full(n, meta.pid, dtype=np.int64),
        "group": text("group", (e.group for e in calls)),
        "seq": ints(e.align_seq for e in calls),
        "torch_seq": ints(e.seq for e in calls),
        "op": text("op", (e.op for e in calls)),
        "kind": text("kind", (_KIND_NAME[int(e.kind)] for e in calls)),
        "input": text("input", (e.input for e in calls)),
        "output": text("output", (e.output for e in calls)),
        "nbytes": ints(e.nbytes for e in calls),
        "peer": ints((e.peer for e in calls), np.int32),
        "group_size": ints((e.group_size for e in calls), np.int32),
        "t_enter": t_enter,
        "t_exit": t_exit,
        "duration_s": np.where(t_exit != _NAT, (t_exit - t_enter) / 1e9, np.nan),
        "state": text("state", (_STATE_NAME[int(e.state)] for e in calls)),
        "in_flight": np.fromiter((e.in_flight for e in calls), bool, n),
        "async": np.fromiter((bool(e.flags & EventFlag.ASYNC) for e in calls), bool, n),
        "composite": np.fromiter((e.is_composite for e in calls), bool, n),
        "callsite": text("callsite", (str(e.callsite) if e.callsite else None for e in calls)),
        "function": text("function", (e.callsite.function if e.callsite else None
                                      for e in calls)),
        "api_callsite": text("api_callsite", (str(e.api_callsite) if e.api_callsite else None
                                              for e in calls)),
        "issuing": text("issuing", (str(e.issuing) if e.issuing else None for e in calls)),
        "thread": ints(e.thread for e in calls),
        "idx": ints(e.idx for e in calls),
        "parent": ints(e.parent for e in calls),
        "source": text("source", (e.source.value for e in calls)),
    }


def frame(parts: list[Columns], cats: Mapping[str, Categories]) -> pd.DataFrame:
    """One DataFrame of the ranks' columns (each column concatenated once; ``parts`` is emptied
    on the way), sorted by rank and record number."""
    ranks = [int(p["rank"][0]) for p in parts if len(p["rank"])]
    cols: dict[str, np.ndarray] = {}
    for name in COLUMNS:  # a column's parts let go as it is joined: the table is held ~once
        cols[name] = np.concatenate([p.pop(name) for p in parts]) if parts else \
            np.zeros(0, dtype=_EMPTY.get(name, np.int32))
    if ranks != sorted(set(ranks)):  # a rank's parts apart (its FR-only calls), or out of order
        order = np.lexsort((cols["idx"], cols["rank"]))
        cols = {name: c[order] for name, c in cols.items()}
    data: dict[str, object] = {}
    for name in COLUMNS:
        c = cols[name]
        if name in TEXT:
            data[name] = pd.Categorical.from_codes(c.astype(np.int32),
                                                   categories=pd.Index(cats[name].values,
                                                                       dtype=object))
        elif name in ("t_enter", "t_exit"):
            data[name] = pd.DatetimeIndex(c.astype("datetime64[ns]"), tz="UTC")
        elif name in ("in_flight", "async", "composite"):
            data[name] = c.astype(bool)
        else:
            data[name] = c
    return pd.DataFrame(data, copy=False)
