"""Recorded calls as columns (pure): one row per collective or point-to-point call a rank made.

Two sources make the same columns:

- ``raw_calls``: a capture read as columns (capture/reader.py ``CaptureColumns``, in a reading
  thread). Every number comes from the record columns in bulk; each row's text - its group,
  op, tensors, kind, state, places - is one signature, a distinct combination of the rank's
  string ids (capture/records.py ``distinct_rows``), looked up once - no Python object per call.
- ``trace_columns``: a rank's typed events (Flight Recorder dumps, or calls merged from them),
  one Python step per event: what has no capture.

Text columns are categorical: each ``Categories`` interns its strings across every rank, in the
order the rows first name them. ``Table`` joins the ranks' parts into one table - a pandas
DataFrame (``frame``: numbers written once into the table's columns, text columns made from
the signatures' codes) or an Arrow table (``arrow``: each part a chunk, as read; what export
writes, without pandas).
"""

from __future__ import annotations

import mmap
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Iterable, Mapping

import numpy as np

from nccl_doctor import call_path
from nccl_doctor.capture.capture_set import read_file
from nccl_doctor.capture.follow import Scan
from nccl_doctor.capture.reader import CaptureColumns, _exit_from
from nccl_doctor.capture.records import FIELDS, _call_path, distinct_rows
from nccl_doctor.errors import DoctorError
from nccl_doctor.location import Location
from nccl_doctor.model import EventFlag, EventKind, EventSource, EventState, RankTrace

if TYPE_CHECKING:  # pandas when a frame is made: export writes Arrow tables without it
    import pandas as pd
    import pyarrow as pa

#: The columns of ``calls``, in order, and what each holds (docs/python-api.md says the same).
COLUMNS: dict[str, str] = {
    "rank": "global rank that made the call",
    "host": "host the rank ran on",
    "pid": "the rank's process id",
    "attempt": "the launch attempt of the job it was made in: 1, then 2, ... where its launcher "
               "restarted it (torchrun --max-restarts, a Slurm requeue)",
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
    "waited_s": "seconds the rank spent in the call: duration_s where it returned; where it "
                "never did (state entered: a hang), from its entry to the end of the rank's "
                "capture - its exit, else the job's stop or end, else its last record",
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
          "t_enter": np.int64, "t_exit": np.int64, "duration_s": np.float64,
          "waited_s": np.float64, "in_flight": bool,
          "async": bool, "composite": bool, "thread": np.int64, "idx": np.int64,
          "parent": np.int64}


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


def categories() -> dict[str, Categories]:
    """A fresh set of interners, one per text column: share it across the ranks of one table."""
    return {name: Categories() for name in TEXT}


def in_flight(part: Columns, idx: set[int], cats: Mapping[str, Categories],
              end_ns: int | None = None) -> Columns:
    """``part`` (in ``cats``' codes) with the calls numbered ``idx`` made what Flight Recorder
    says they are: still in flight, the rank inside them (capture/flight_recorder.py) until
    ``end_ns``, the end of its capture (``rank_end``; None: unknown, ``waited_s`` NaN)."""
    if not idx or not len(part["idx"]):
        return part
    at = np.isin(part["idx"], np.fromiter(idx, dtype=np.int64, count=len(idx)))
    out = dict(part)
    out["state"] = np.where(at, cats["state"].code("entered"), part["state"]).astype(np.int32)
    out["in_flight"] = part["in_flight"] | at
    out["t_exit"] = np.where(at, _NAT, part["t_exit"])
    out["duration_s"] = np.where(at, np.nan, part["duration_s"])
    if "waited_s" in part:
        left = np.nan if end_ns is None else (end_ns - part["t_enter"]) / 1e9
        out["waited_s"] = np.where(at, left, part["waited_s"])
    return out


def rank_end(last_ns: int, exit_ns: int | None, job_end: Iterable[int] = ()) -> int:
    """Where a rank's capture ends (ns), for the calls it never returned from (``waited_s``):
    its exit, where the capture records one (``exit_ns``: an exception's or the interpreter's
    exit, ``exit_time``); else the first of its job's stop and end (``job_end``: the
    watchdog's stop, the manifest's end) at or after its last record; else its last record
    (``last_ns``: its latest entry, exit or note). Never before its last record: a rank
    blocked in a call records nothing more, so its last record is that call's entry."""
    if exit_ns is not None:
        return max(last_ns, exit_ns)
    return min((t for t in job_end if t >= last_ns), default=last_ns)


def exit_time(notes: Iterable[Mapping[str, Any]]) -> tuple[int | None, int]:
    """(when the rank left, as its notes say - the time of the exit capture/reader.py
    ``_exit_from`` reads from them: its exception's, else its interpreter's exit's; None:
    neither recorded, the time of its latest note; 0: none)."""
    notes = list(notes)
    times = [_ns(n.get("time_ns")) for n in notes]
    return _ns(_exit_from(notes, None).time_ns), max((t for t in times if t is not None),
                                                       default=0)


def _ns(value: object) -> int | None:
    """A recorded time (ns), or None for anything that is not one (a capture is input)."""
    return value if isinstance(value, int) and not isinstance(value, bool) else None


Columns = dict[str, np.ndarray]
#: The text columns a row's signature holds (``Raw``): every one but the rank's host.
SIGNED = tuple(name for name in TEXT if name != "host")


@dataclass(frozen=True)
class Raw:
    """One capture's calls as a reading thread makes them, before the table codes their text
    (``coded``): the numbers as columns, and each row's signature - the number of its distinct
    combination of text values, ``texts[sig]`` (the ``SIGNED`` columns') - so that each text is
    looked up once per signature, never once per row."""

    rank: int
    host: str
    pid: int
    cols: Columns  # the columns of COLUMNS that are not text
    sig: np.ndarray  # per row: its signature
    texts: list[tuple[str | None, ...]]  # per signature: its SIGNED values
    attempt: int = 1  # the launch attempt's number (Job: 1 the first)
    end_ns: int = 0  # where the rank's capture ends (``rank_end``)


def raw_calls(capture: CaptureColumns | Scan, job_end: Iterable[int] = ()) -> Raw:
    """The calls of one capture read as columns (reader.CaptureColumns, or a follower's Scan);
    ``job_end``: when its job was stopped or ended (``rank_end``), ns."""
    if isinstance(capture, Scan):
        d = capture.decoded
        cols: Mapping[str, np.ndarray] = {name: d.rows[name] for name in FIELDS}
        exited = d.exited
    else:
        cols, exited = capture.cols, capture.exited
    kind = cols["kind"]
    at = np.flatnonzero((kind == _COLLECTIVE) | (kind == _P2P))
    pick: slice | np.ndarray = at
    if len(at) and int(at[-1]) - int(at[0]) + 1 == len(at):  # one run: views, no copy
        pick = slice(int(at[0]), int(at[-1]) + 1)
    n = len(at)

    def col(name: str, dtype: type | None = None) -> np.ndarray:
        values = cols[name][pick]
        if dtype is None or values.dtype == dtype:
            return values
        if values.dtype.itemsize == np.dtype(dtype).itemsize and values.dtype.kind in "iu":
            return values.view(dtype)  # (u64 -> i64: the same bits astype gives)
        return values.astype(dtype)

    done = exited[pick]
    seq = col("seq", np.int64)
    t_enter = col("t_enter", np.int64)
    t_exit = np.where(done, col("t_exit", np.int64), _NAT)
    duration = np.where(done, (t_exit - t_enter) / 1e9, np.nan)
    # every record's times, calls or not: where the rank's capture ends
    left, noted = exit_time(capture.notes)
    last = max(noted, int(cols["t_enter"].max()) if len(cols["t_enter"]) else 0,
               int(cols["t_exit"][exited].max()) if exited.any() else 0)
    end = rank_end(last, left, job_end)
    flags = col("flags")
    out: Columns = {
        "seq": np.where(seq >= 0, seq - col("seq_offset").astype(np.int64), -1),
        "torch_seq": seq,
        "nbytes": col("nbytes", np.int64),
        "peer": col("peer", np.int32),
        "group_size": col("group_size", np.int32),
        "t_enter": t_enter,
        "t_exit": t_exit,
        "duration_s": duration,
        "waited_s": np.where(done, duration, (end - t_enter) / 1e9),
        "in_flight": np.zeros(n, dtype=bool),
        "async": (flags & int(EventFlag.ASYNC)) != 0,
        "composite": (flags & int(EventFlag.COMPOSITE)) != 0,
        "thread": col("thread", np.int64),
        "idx": col("idx", np.int64),
        "parent": col("parent", np.int64),
    }
    # the row's text, in numbers: its names' string ids, its places, its kind and state
    u64 = np.uint64
    state = np.where(done, col("state").astype(u64), u64(int(EventState.ENTERED)))
    functional = ((flags & _FUNCTIONAL) != 0).astype(u64)
    path = col("path").astype(u64) if capture.paths else np.zeros(n, dtype=u64)
    packed = [col("group").astype(u64) | (col("op").astype(u64) << u64(32)),
              col("input").astype(u64) | (col("output").astype(u64) << u64(32)),
              col("ufile").astype(u64) | (col("uline").astype(u64) << u64(32)),
              col("ufunc").astype(u64) | (col("afile").astype(u64) << u64(32)),
              col("aline").astype(u64) | (path << u64(32)),
              col("kind").astype(u64) | (state << u64(8)) | (functional << u64(24))]
    sig, distinct = _distinct(packed)
    get = capture.strings.get
    places: dict[tuple[int, ...], tuple[str | None, ...]] = {}
    texts = []
    for ga, io, uf_ul, ufn_af, al_p, ksf in distinct:
        place = (uf_ul, ufn_af, al_p)
        if place not in places:
            places[place] = _places(uf_ul & _LOW, uf_ul >> 32, ufn_af & _LOW, ufn_af >> 32,
                                    al_p & _LOW, al_p >> 32, get)
        texts.append((get(ga & _LOW, "<?>"), get(ga >> 32, "<?>"), _KIND_NAME[ksf & 0xFF],
                      get(io & _LOW, ""), get(io >> 32, ""), _STATE_NAME[(ksf >> 8) & 0xFFFF],
                      *places[place],
                      (EventSource.FUNCTIONAL if ksf >> 24 else EventSource.RECORDER).value))
    return Raw(capture.meta.rank, capture.meta.host, capture.meta.pid, out,
               sig.astype(np.int32), texts, end_ns=end)


_COLLECTIVE, _P2P = int(EventKind.COLLECTIVE), int(EventKind.P2P)
_FUNCTIONAL = int(EventFlag.FUNCTIONAL)
_LOW = 0xFFFFFFFF
assert SIGNED == ("group", "op", "kind", "input", "output", "state", "callsite", "function",
                  "api_callsite", "issuing", "source")


def _places(uf: int, ul: int, ufn: int, af: int, al: int, path: int,
            get: Callable[..., str | None]) -> tuple[str | None, ...]:
    """(callsite, function, api_callsite, issuing) of one place of a rank's calls."""
    user = Location(get(uf, "<?>"), ul, get(ufn, "")) if uf else None
    api = Location(get(af, "<?>"), al) if af else None
    frames = _call_path(get(path), get) if path else ()
    return (str(user) if user else None, user.function if user else None,
            str(api) if api else None, _issuing(frames, user, api))


def coded(raw: Raw, cats: Mapping[str, Categories]) -> Columns:
    """A capture's calls (``raw_calls``) as the table's columns, their text coded into ``cats``
    (in the order the rows name them: the categories' order is the rows')."""
    n = len(raw.sig)
    out: Columns = {"rank": np.full(n, raw.rank, dtype=np.int32),
                    "host": np.full(n, cats["host"].code(raw.host), dtype=np.int32),
                    "pid": np.full(n, raw.pid, dtype=np.int64),
                    "attempt": np.full(n, raw.attempt, dtype=np.int32)}
    cats["source"].code(EventSource.RECORDER.value)  # (a capture's: as ``Table`` codes it)
    codes = np.array([[cats[name].code(v) for name, v in zip(SIGNED, values)]
                      for values in raw.texts], dtype=np.int32).reshape(len(raw.texts),
                                                                        len(SIGNED))
    for j, name in enumerate(SIGNED):
        out[name] = codes[:, j][raw.sig] if n else np.zeros(0, dtype=np.int32)
    out.update(raw.cols)
    return {name: out[name] for name in COLUMNS}


def capture_calls(path: Path) -> Raw | None:
    """One capture file's calls (``raw_calls``), read here. None: it cannot be read."""
    try:
        return raw_calls(read_file(path))
    except DoctorError:
        return None


def _distinct(cols: list[np.ndarray]) -> tuple[np.ndarray, list[tuple[int, ...]]]:
    """(row -> the number of its distinct tuple, the distinct tuples) of the columns' rows,
    the tuples numbered in the order the rows first show them (capture/records.py
    ``distinct_rows``: a hash table in C)."""
    if not len(cols[0]):
        return np.zeros(0, dtype=np.int64), []
    inverse, first = distinct_rows(cols)
    return inverse, [tuple(int(c[i]) for c in cols) for i in first.tolist()]


def _issuing(frames: tuple[Location, ...], user: Location | None,
             api: Location | None) -> str | None:
    """``Event.issuing`` as text (nccl_doctor/call_path.py), else the user's line, else the
    API's caller."""
    place = call_path.issuing(frames, user) or api
    return str(place) if place else None


def trace_columns(trace: RankTrace, cats: Mapping[str, Categories], attempt: int = 1,
                  job_end: Iterable[int] = (), end_ns: int | None = None) -> Columns:
    """The calls among one rank's typed events, as the same columns (of launch ``attempt``);
    ``waited_s`` up to ``end_ns`` (the rank's end, where its capture's columns said it), else
    up to the end ``rank_end`` finds in its events and the job's stop or end (``job_end``)."""
    calls = [e for e in trace.events if e.kind in (EventKind.COLLECTIVE, EventKind.P2P)]
    meta = trace.meta
    n = len(calls)
    if end_ns is None:
        left, noted = exit_time(trace.notes)
        last = max([noted, *(e.t_enter_ns for e in trace.events),
                    *(e.t_exit_ns for e in trace.events if e.t_exit_ns is not None)])
        end_ns = rank_end(last, left, job_end)

    def text(name: str, values: Iterable[str | None]) -> np.ndarray:
        return np.fromiter((cats[name].code(v) for v in values), dtype=np.int32, count=n)

    def ints(values: Iterable[int], dtype: type = np.int64) -> np.ndarray:
        return np.fromiter(values, dtype=dtype, count=n)

    t_exit = ints(e.t_exit_ns if e.done and e.t_exit_ns is not None else _NAT for e in calls)
    t_enter = ints(e.t_enter_ns for e in calls)
    duration = np.where(t_exit != _NAT, (t_exit - t_enter) / 1e9, np.nan)
    # (a Flight Recorder entry that completed has no exit time: it did not wait to the end)
    entered = np.fromiter((not e.done for e in calls), bool, n)
    return {
        "rank": np.full(n, meta.rank, dtype=np.int32),
        "host": np.full(n, cats["host"].code(meta.host), dtype=np.int32),
        "pid": np.full(n, meta.pid, dtype=np.int64),
        "attempt": np.full(n, attempt, dtype=np.int32),
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
        "duration_s": duration,
        "waited_s": np.where(entered, (end_ns - t_enter) / 1e9, duration),
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


def frame(parts: list[Columns | Raw], cats: Mapping[str, Categories]) -> pd.DataFrame:
    """One DataFrame of the ranks' columns (``parts`` is emptied on the way), sorted by rank and
    record number."""
    table = Table(cats, expect=len(parts))
    for part in parts:
        table.add(part)
    parts.clear()
    return table.frame()


#: The columns of COLUMNS that are not text, and their dtypes.
NUMBERS = {name: np.dtype(_EMPTY.get(name, np.int32)) for name in COLUMNS if name not in TEXT}


class Table:
    """The calls table as it is made, part after part (a rank's calls: ``Raw``, or columns
    coded into ``cats``), its text as one signature per row - the table's codes of each text
    column looked up per signature, the columns made from them at the end. ``whole``: its
    numbers written straight into the table's columns, made once for the rows ``expect`` parts
    like the first will hold (grown if need be) - a large table's memory is the table's, once;
    else each part's columns kept as they are, for ``arrow()`` to make a chunk of each (no
    copy: ``export``)."""

    def __init__(self, cats: Mapping[str, Categories], expect: int = 1,
                 whole: bool = True) -> None:
        self.cats, self.expect, self.whole, self.n = cats, max(expect, 1), whole, 0
        self.cols = {name: np.zeros(0, dtype=dtype) for name, dtype in NUMBERS.items()}
        self.sig = np.zeros(0, dtype=np.int32)
        self.codes: list[np.ndarray] = []  # per part: its signatures' codes, (k, len(TEXT))
        self.pieces: list[tuple[dict[str, np.ndarray], np.ndarray]] = []  # (not whole)
        self.signatures = 0
        self.firsts: list[int] = []  # the rank of each part with calls, in the order added
        self._coded: dict[tuple[str | None, ...], list[int]] = {}  # SIGNED texts -> codes

    def add(self, part: Columns | Raw) -> None:
        if isinstance(part, Raw):
            self._add_raw(part)
            return
        n = len(part["rank"])
        sig, distinct = _distinct([part[name] for name in TEXT])
        codes = np.array(distinct, dtype=np.int32).reshape(len(distinct), len(TEXT))
        self._add(n, {name: part[name] for name in NUMBERS}, sig, codes)

    def _add_raw(self, raw: Raw) -> None:
        cats, coded = self.cats, self._coded
        host = cats["host"].code(raw.host)
        cats["source"].code(EventSource.RECORDER.value)  # (a capture's: as its rows' would)
        rows = []
        for values in raw.texts:  # each distinct one coded once for the table
            row = coded.get(values)
            if row is None:
                row = coded[values] = [cats[name].code(v) for name, v in zip(SIGNED, values)]
            rows.append([host, *row])
        n = len(raw.sig)
        numbers = dict(raw.cols, rank=raw.rank, pid=raw.pid, attempt=raw.attempt)
        self._add(n, numbers, raw.sig,
                  np.array(rows, dtype=np.int32).reshape(len(raw.texts), len(TEXT)))

    def _add(self, n: int, numbers: Mapping[str, np.ndarray | int], sig: np.ndarray,
             codes: np.ndarray) -> None:
        if n:
            first = numbers["rank"]
            self.firsts.append(int(first if np.isscalar(first) else first[0]))
        if not self.whole:  # (a rank's own number - its rank, pid, attempt - kept as one)
            self.pieces.append(({name: numbers[name] for name in NUMBERS}, sig))
            self.codes.append(codes)
            self.n += n
            return
        lo = self.n
        self._room(lo + n)
        for name, col in self.cols.items():
            col[lo:lo + n] = numbers[name]
        np.add(sig, self.signatures, out=self.sig[lo:lo + n], casting="unsafe")
        self.codes.append(codes)
        self.signatures += len(codes)
        self.n += n

    def _room(self, rows: int) -> None:
        if rows <= len(self.sig):
            return
        grown = max(rows, len(self.sig) * 3 // 2 + 1024)
        if not len(self.sig):  # the first part: room for as many parts like it as expected
            grown = max(rows, rows * self.expect + rows * self.expect // 20)
        for name, col in list(self.cols.items()):
            self.cols[name] = _grown(col, grown, self.n)
        self.sig = _grown(self.sig, grown, self.n)

    def _made_whole(self) -> None:
        """The parts kept apart (``whole`` False) written into one table's columns."""
        if self.whole:
            return
        pieces, codes = self.pieces, self.codes
        self.whole, self.n, self.pieces, self.codes, self.firsts = True, 0, [], [], []
        for (numbers, sig), part_codes in zip(pieces, codes):
            self._add(len(sig), numbers, sig, part_codes)

    def _columns(self) -> tuple[dict[str, np.ndarray], np.ndarray, np.ndarray]:
        """(the numbers, each row's signature, the signatures' codes), by rank and record,
        let go by this object."""
        self._made_whole()
        n = self.n
        cols = {name: col[:n] for name, col in self.cols.items()}
        sig = self.sig[:n]
        self.cols, self.sig = {}, np.zeros(0, dtype=np.int32)
        if self.firsts != sorted(set(self.firsts)):  # a rank's parts apart, or out of order
            order = np.lexsort((cols["idx"], cols["rank"]))
            cols = {name: c[order] for name, c in cols.items()}
            sig = sig[order]
        codes = np.concatenate(self.codes) if self.codes else \
            np.zeros((0, len(TEXT)), dtype=np.int32)
        return cols, sig, codes

    def frame(self) -> pd.DataFrame:
        """The table as a pandas DataFrame (its columns let go by this object)."""
        import pandas as pd

        cols, sig, codes = self._columns()
        dtypes = [_code_dtype(len(self.cats[name].values)) for name in TEXT]
        text = dict(zip(TEXT, _taken(codes, sig, dtypes)))
        data: dict[str, object] = {}
        for name in COLUMNS:
            if name in TEXT:
                # (the codes as narrow as pandas would make them: it would copy them to narrow)
                data[name] = pd.Categorical.from_codes(
                    text.pop(name), categories=pd.Index(self.cats[name].values, dtype=object))
            elif name in ("t_enter", "t_exit"):
                data[name] = utc(cols.pop(name))
            else:
                data[name] = cols.pop(name)
        return pd.DataFrame(data, copy=False)

    def arrow(self) -> pa.Table:
        """The table as an Arrow table, as pyarrow makes one of the DataFrame (``frame``):
        text columns as dictionaries, NaT and NaN as nulls (its columns let go by this
        object; no pandas). Parts kept apart are a chunk each; their text, and a number each
        part holds one of (its rank), one chunk for them all."""
        import pyarrow as pa

        if self.whole or self.firsts != sorted(set(self.firsts)):
            cols, sig, codes = self._columns()
            pieces = [(cols, sig)]
        else:  # the parts in their order: their signatures and codes as one table's
            pieces = [(numbers, sig) for numbers, sig in self.pieces if len(sig)]
            offsets = np.cumsum([0] + [len(c) for c in self.codes[:-1]], dtype=np.int32)
            sig = np.concatenate([s + o for (_, s), o in zip(self.pieces, offsets)]) \
                if pieces else np.zeros(0, dtype=np.int32)
            codes = np.concatenate(self.codes) if self.codes else \
                np.zeros((0, len(TEXT)), dtype=np.int32)
            self.pieces, self.codes = [], []
        dictionaries = {name: _arrow_text(self.cats[name].values) for name in TEXT}
        chunks: dict[str, list[pa.Array]] = {name: [] for name in COLUMNS}
        for name, at in zip(TEXT, _taken(codes, sig, [np.int32] * len(TEXT))):
            nulls = at < 0 if (codes[:, TEXT.index(name)] < 0).any() else None
            chunks[name].append(pa.DictionaryArray.from_arrays(
                _arrow(pa.int32(), at, nulls), dictionaries[name], safe=False))
        lengths = [len(sig) for _, sig in pieces]
        for name, dtype in NUMBERS.items():
            if all(np.isscalar(numbers[name]) for numbers, _ in pieces):  # one per part
                repeated = np.repeat(np.array([numbers[name] for numbers, _ in pieces],
                                              dtype=dtype), lengths)
                chunks[name].append(_arrow(pa.from_numpy_dtype(repeated.dtype), repeated))
                continue
            for (numbers, _), n in zip(pieces, lengths):
                col = numbers[name]
                if np.isscalar(col):
                    col = np.full(n, col, dtype=dtype)
                if name in ("t_enter", "t_exit"):
                    chunks[name].append(_arrow(pa.timestamp("ns", tz="UTC"), col, col == _NAT))
                elif name in ("duration_s", "waited_s"):
                    chunks[name].append(_arrow(pa.float64(), col, np.isnan(col)))
                else:
                    chunks[name].append(_arrow(pa.from_numpy_dtype(col.dtype), col))
        types = _arrow_types()
        return pa.Table.from_arrays([pa.chunked_array(chunks[name], types[name])
                                     for name in COLUMNS], names=list(COLUMNS))


def _arrow_types() -> dict[str, pa.DataType]:
    import pyarrow as pa

    out = {name: pa.dictionary(pa.int32(), pa.string()) for name in TEXT}
    out.update({name: pa.from_numpy_dtype(dtype) for name, dtype in NUMBERS.items()})
    out["t_enter"] = out["t_exit"] = pa.timestamp("ns", tz="UTC")
    return out


# Arrow arrays from their buffers: pyarrow's own conversions of numpy arrays and lists look
# for pandas (and import it: 0.4 s of an export that needs none of it)

def _arrow(kind: pa.DataType, values: np.ndarray, nulls: np.ndarray | None = None) -> pa.Array:
    """``values`` (of ``kind``'s width; bool: one a byte) as an Arrow array, ``nulls`` null."""
    import pyarrow as pa

    valid = None
    if nulls is not None and nulls.any():
        valid = pa.py_buffer(np.packbits(~nulls, bitorder="little"))
    if values.dtype == bool:
        data = pa.py_buffer(np.packbits(values, bitorder="little"))
    else:
        data = pa.py_buffer(np.ascontiguousarray(values))
    return pa.Array.from_buffers(kind, len(values), [valid, data])


def _arrow_text(values: list[str]) -> pa.Array:
    """``values`` as an Arrow array of strings."""
    import pyarrow as pa

    encoded = [v.encode("utf-8", "surrogatepass") for v in values]
    offsets = np.zeros(len(encoded) + 1, dtype=np.int32)
    np.cumsum([len(e) for e in encoded], out=offsets[1:])
    return pa.Array.from_buffers(pa.string(), len(encoded),
                                 [None, pa.py_buffer(offsets), pa.py_buffer(b"".join(encoded))])


def _grown(col: np.ndarray, rows: int, used: int) -> np.ndarray:
    out = unpaged(rows, col.dtype)
    out[:used] = col[:used]
    return out


def unpaged(rows: int, dtype: np.dtype | type) -> np.ndarray:
    """A new array of ``rows``; past 32 MiB in memory mapped for it alone, in small pages.
    numpy asks for huge pages (2 MiB) for an array past 4 MiB; where free memory goes back to a
    virtual machine's host in blocks that size (free page reporting), each huge page is new to
    the host: filling a 1 GiB table took 3.6 s of system time so against 0.9 s in small pages
    (the development VM). Below 32 MiB the allocator may hand out memory let go before (the
    columns of export's previous piece): new pages for none. The mapping lives as long as the
    array (its base)."""
    dtype = np.dtype(dtype)
    if rows * dtype.itemsize < 32 << 20:  # (glibc's largest threshold for its own mapping)
        return np.empty(rows, dtype=dtype)
    return np.frombuffer(mmap.mmap(-1, rows * dtype.itemsize), dtype=dtype, count=rows)


def _taken(codes: np.ndarray, sig: np.ndarray, dtypes: list[type]) -> list[np.ndarray]:
    """Each text column of the rows whose signatures are ``sig``: ``codes[sig, j]`` as
    ``dtypes[j]``, a million rows at a time (the signatures made intp once for every column:
    np.take would copy them for each, and fancy indexing with int32 is slower)."""
    tables = [np.ascontiguousarray(codes[:, j], dtype=dtype) for j, dtype in enumerate(dtypes)]
    outs = [unpaged(len(sig), dtype) for dtype in dtypes]
    for lo in range(0, len(sig), 1 << 20):
        at = sig[lo:lo + (1 << 20)].astype(np.intp)
        for table, out in zip(tables, outs):
            np.take(table, at, out=out[lo:lo + len(at)])
    return outs


def _code_dtype(categories: int) -> type:
    """The dtype pandas keeps a categorical's codes in (pandas.core.dtypes.cast
    coerce_indexer_dtype)."""
    for dtype in (np.int8, np.int16, np.int32):
        if categories < np.iinfo(dtype).max:
            return dtype
    return np.int64


def utc(ns: np.ndarray) -> pd.api.extensions.ExtensionArray | pd.DatetimeIndex:
    """Nanoseconds since the epoch (int64; NaT: its minimum) as UTC timestamps, without a
    copy: ``pd.DatetimeIndex(ns, tz="UTC")`` converts each of 10 million values (0.5 s)."""
    import pandas as pd

    values = np.asarray(ns, dtype=np.int64).view("M8[ns]")
    try:  # pandas' own constructor of the array it would make (a test holds them equal)
        return pd.arrays.DatetimeArray._simple_new(values,
                                                   dtype=pd.DatetimeTZDtype(unit="ns", tz="UTC"))
    except (AttributeError, TypeError):  # (another pandas)
        return pd.DatetimeIndex(values, tz="UTC")
