"""Event records as columns: a ring's bytes -> a numpy structured array, checked in bulk.

The record layout is fixed (nccl_doctor/capture/format.py: ENTER, its Adler-32, EXIT), so a whole
ring decodes as one ``numpy.frombuffer`` with the structured ``RECORD`` dtype, and every check the
reader makes - blank slot, Adler-32 of the enter part, index in its slot, exit check word, known
kind - is made in one pass over the records: in C (capture/_ring.c ``check_records``, without the
GIL, so that captures read on several threads check in parallel), else one vectorised numpy
expression over the column (``check_numpy``: the same verdicts). ``read_ring`` reads a ring's
slots from its file, checks them and splits the trusted records into one column per field, in
that one pass (the bulk readers: reader.py ``read_columns``). ``Event`` objects are made only for
the rows a caller asks for (``events``): the analysis passes and the reporters see the typed
model, the bulk of a large capture never becomes Python objects.
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass
from typing import Callable, Mapping

import numpy as np

from nccl_doctor.capture import format as fmt
from nccl_doctor.capture.ring import PURE_PYTHON_ENV
from nccl_doctor.location import Location
from nccl_doctor.model import Event, EventFlag, EventKind, EventSource, EventState

try:
    from nccl_doctor.capture import _ring as _c
except ImportError:  # built without a C compiler: the numpy checks give the same verdicts
    _c = None

#: One 128-byte record (format.ENTER, its check, padding, format.EXIT), little-endian.
RECORD = np.dtype([
    ("idx", "<u8"), ("parent", "<u8"), ("t_enter", "<u8"), ("seq", "<i8"), ("nbytes", "<u8"),
    ("thread", "<u8"), ("op", "<u4"), ("group", "<u4"), ("input", "<u4"), ("output", "<u4"),
    ("ufile", "<u4"), ("uline", "<u4"), ("ufunc", "<u4"), ("afile", "<u4"), ("aline", "<u4"),
    ("path", "<u4"), ("peer", "<i4"), ("group_size", "<i4"), ("seq_offset", "<u4"),
    ("kind", "u1"), ("flags", "u1"), ("pad", "<u2"), ("check", "<u4"), ("pad2", "<u4"),
    ("t_exit", "<u8"), ("seq_delta", "<i2"), ("state", "<u2"), ("exit_check", "<u4"),
])
assert RECORD.itemsize == fmt.RECORD_SIZE and RECORD.fields["t_exit"][1] == fmt.EXIT_OFFSET
assert RECORD.fields["check"][1] == fmt.ENTER.size

_ENTER = fmt.ENTER.size
# Adler-32 over the enter part: a = 1 + sum(x), b = n + sum((n - i) * x_i), both far below 2**32
# for 104 bytes, so integer sums compute them exactly (einsum: no BLAS threads in the supervisor).
_ONES = np.ones(_ENTER, dtype=np.uint32)
_WEIGHTS = np.arange(_ENTER, 0, -1, dtype=np.uint32)
_KINDS = np.array(sorted(int(k) for k in EventKind), dtype=np.uint8)
_EXIT_STATES = np.array([int(EventState.RETURNED), int(EventState.FAILED), int(EventState.ISSUED)],
                        dtype=np.uint16)
_CHUNK = 8192  # records checked per step: bounds the float32 copy of their bytes

#: A record's verdict (``check``), as _ring.c's check_records writes it too: a slot never
#: written; a damaged record; a trusted one still inside its call (its exit part blank); one
#: that returned (a valid exit part); one whose exit part is damaged (it reads as still inside).
BLANK, DAMAGED, ENTERED, EXITED, CUT_EXIT = range(5)
_KIND_TABLE = bytes(1 if k in set(_KINDS.tolist()) else 0 for k in range(256))
_STATE_BYTES = _EXIT_STATES.astype("<u2").tobytes()
# the records' checks in C (capture/_ring.c), without the GIL; absent from an older build
_C_CHECK = getattr(_c, "check_records", None)


#: The fields a record splits into (``read_ring``): every field but the padding and the checks.
FIELDS = tuple(name for name in RECORD.names if name not in ("pad", "pad2", "check", "exit_check"))
_C_READ = getattr(_c, "read_ring", None)


@dataclass(frozen=True)
class Split:
    """The trusted records of some ring slots as columns, in slot order (``read_ring``)."""

    cols: dict[str, np.ndarray]  # field -> one value per trusted record
    exited: np.ndarray  # bool per record: its exit part is valid
    slots: np.ndarray  # int64: the slot of each record
    verdicts: np.ndarray  # uint8 per slot read (BLANK ... CUT_EXIT)


def read_ring(fd: int, offset: int, first: int, count: int, capacity: int,
              fields: tuple[str, ...] = FIELDS) -> Split:
    """Slots ``first`` .. ``first + count - 1`` of a ring, read from file ``fd`` at ``offset``
    (slot ``first``'s), checked (``check``) and their trusted records split into ``fields``'
    columns. Slots past the end of the file read blank. In C when the extension is built: each
    record read, checked and split in one pass without the GIL (capture/_ring.c). Raises
    OSError as the file's reads do."""
    if _C_READ is not None and native():
        outs, slots, exited, verdicts = _outputs(count, fields)
        spec = b"".join(bytes((RECORD.fields[f][1], RECORD.fields[f][0].itemsize))
                        for f in fields)
        _, kept = _C_READ(fd, offset, first, count, capacity, _KIND_TABLE, _STATE_BYTES, spec,
                          outs, exited, slots, verdicts)
        return Split({f: o[:kept] for f, o in zip(fields, outs)}, exited[:kept], slots[:kept],
                     verdicts)
    raw = os.pread(fd, count * fmt.RECORD_SIZE, offset) if count else b""
    rows = np.zeros(count, dtype=RECORD)
    got = as_records(raw)
    rows[:len(got)] = got
    at = np.arange(first, first + count, dtype=np.int64)
    verdicts = check_numpy(rows, at, capacity)
    trusted = verdicts >= ENTERED
    kept = rows[trusted]
    return Split({f: np.ascontiguousarray(kept[f]) for f in fields},
                 verdicts[trusted] == EXITED, at[trusted], verdicts)


def _outputs(count: int, fields: tuple[str, ...],
             ) -> tuple[tuple[np.ndarray, ...], np.ndarray, np.ndarray, np.ndarray]:
    """``read_ring``'s outputs - a column per field, the slots, the exited flags and the
    verdicts - as views of one block of memory: one allocation a capture, which the allocator
    hands to the next capture once this one's columns are let go (two dozen arrays a capture
    would be new pages each time: half the reading's time)."""
    sizes = [RECORD.fields[f][0].itemsize for f in fields]
    block = np.empty(count * (sum(sizes) + 8 + 2), dtype=np.uint8)
    at = count * 8
    slots = block[:at].view(np.int64)
    outs: list[np.ndarray | None] = [None] * len(fields)
    for i in sorted(range(len(fields)), key=lambda i: -sizes[i]):  # (each aligned)
        outs[i] = block[at:at + count * sizes[i]].view(RECORD.fields[fields[i]][0])
        at += count * sizes[i]
    exited = block[at:at + count].view(bool)
    verdicts = block[at + count:at + 2 * count]
    return tuple(outs), slots, exited, verdicts  # type: ignore[return-value]


_C_DISTINCT = getattr(_c, "distinct_rows", None)


def distinct_rows(cols: list[np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """(row -> the number of its distinct tuple, the first row of each tuple) of the rows of
    ``cols`` (equally long integer columns, as uint64), the tuples numbered in the order the rows
    first show them. In C when the extension is built (a hash table: exact), else by a sort."""
    n = len(cols[0])
    cols = [np.ascontiguousarray(c, dtype=np.uint64) for c in cols]
    if _C_DISTINCT is not None and native() and len(cols) <= 16:
        inverse = np.empty(n, dtype=np.int64)
        first = np.empty(n, dtype=np.int64)
        count = _C_DISTINCT(tuple(cols), inverse, first)
        return inverse, first[:count].copy()
    if not n:
        return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64)
    _, at, inverse = np.unique(np.stack(cols, axis=1), axis=0, return_index=True,
                               return_inverse=True)
    order = np.argsort(at, kind="stable")  # numbered as the rows first show them
    number = np.empty(len(order), dtype=np.int64)
    number[order] = np.arange(len(order))
    return number[inverse.reshape(-1)], at[order]


def check(records: np.ndarray, slots: np.ndarray, capacity: int) -> np.ndarray:
    """The verdict (BLANK ... CUT_EXIT, uint8) of each of ``records``, RECORD rows read from
    ring slots ``slots``: blank (all zero), damaged (its Adler-32 fails, its index does not
    belong in its slot, or its kind is unknown), or trusted - and then whether its exit part is
    blank, valid (``t_exit`` set, the check word binds it to the record, an exit state) or
    damaged. In C when the extension is built (``NCCL_DOCTOR_PURE_PYTHON=1``: numpy)."""
    slots = np.ascontiguousarray(slots, dtype=np.int64)
    if _C_CHECK is not None and native():
        rows = np.ascontiguousarray(records)
        out = np.empty(len(rows), dtype=np.uint8)
        _C_CHECK(rows.view(np.uint8), slots, capacity, _KIND_TABLE, _STATE_BYTES, out)
        return out
    return check_numpy(records, slots, capacity)


def native() -> bool:
    """Whether the C checks are in use (the extension built, not switched off by the
    environment as the C ring is: ``NCCL_DOCTOR_PURE_PYTHON``)."""
    return _C_CHECK is not None and os.environ.get(PURE_PYTHON_ENV, "") in ("", "0")


def check_numpy(records: np.ndarray, slots: np.ndarray, capacity: int) -> np.ndarray:
    """``check`` in numpy: every check one vectorised expression over the column."""
    out = np.zeros(len(records), dtype=np.uint8)
    words = np.ascontiguousarray(records).view(np.uint64).reshape(len(records),
                                                                  fmt.RECORD_SIZE // 8)
    at = np.flatnonzero(words.any(axis=1))
    recs = records[at]
    raw = recs.view(np.uint8).reshape(len(recs), fmt.RECORD_SIZE)
    ok = np.empty(len(recs), dtype=bool)
    for lo in range(0, len(recs), _CHUNK):
        ok[lo:lo + _CHUNK] = adler32(raw[lo:lo + _CHUNK, :_ENTER]) == recs["check"][lo:lo + _CHUNK]
    idx = recs["idx"]
    ok &= idx >= 1
    ok &= (idx - np.uint64(1)) % np.uint64(capacity) == np.asarray(slots)[at].astype(np.uint64)
    ok &= np.isin(recs["kind"], _KINDS)
    t_exit, word = recs["t_exit"], recs["exit_check"]
    has_exit = (t_exit != 0) & (exit_check(recs) == word) & np.isin(recs["state"], _EXIT_STATES)
    cut_exit = (t_exit != 0) | (word != 0)
    out[at] = np.where(~ok, DAMAGED, np.where(has_exit, EXITED,
                                              np.where(cut_exit, CUT_EXIT, ENTERED)))
    return out


@dataclass(frozen=True)
class Decoded:
    """The trusted records of some ring slots, sorted by index, and what could not be trusted."""

    rows: np.ndarray  # RECORD rows that passed every check, by ascending idx
    exited: np.ndarray  # bool per row: its exit part is valid (else the call reads ENTERED)
    slots: np.ndarray  # the slot of each row
    torn_slots: np.ndarray  # slots holding a damaged record or a row's damaged exit part

    @property
    def torn(self) -> int:
        """Records (or exit parts) cut off mid-write or damaged."""
        return len(self.torn_slots)


def as_records(raw: object) -> np.ndarray:
    """View whole records in ``raw`` (bytes, mmap, memoryview) as RECORD rows, without copying."""
    buf = memoryview(raw).cast("B")
    return np.frombuffer(buf, dtype=RECORD, count=len(buf) // fmt.RECORD_SIZE)


def adler32(enter: np.ndarray) -> np.ndarray:
    """Adler-32 of each row of ``enter`` (uint8, shape (n, 104)) as uint32."""
    n = enter.shape[1]
    a = np.einsum("ij,j->i", enter, _ONES[-n:]) + 1
    b = np.einsum("ij,j->i", enter, _WEIGHTS[-n:]) + n
    return ((b % 65521) << 16) | (a % 65521)


def exit_check(rows: np.ndarray) -> np.ndarray:
    """format.exit_check for every row (uint64 arithmetic: the low 32 bits are the same)."""
    idx, t_exit = rows["idx"], rows["t_exit"]
    state = rows["state"].astype(np.uint64)
    delta = (rows["seq_delta"].astype(np.int64) & 0xFFFF).astype(np.uint64)
    with np.errstate(over="ignore"):
        word = (idx * np.uint64(0x9E3779B1)) ^ t_exit ^ (state << np.uint64(20)) ^ delta
    return (word & np.uint64(0xFFFFFFFF)).astype(np.uint32)


def decode(records: np.ndarray, slots: np.ndarray, capacity: int) -> Decoded:
    """Check ``records`` (RECORD rows read from ring slots ``slots``) and keep the trusted ones.

    A slot never written (all zero) is skipped. A record is trusted when its Adler-32 holds, its
    index belongs in its slot and its kind is known; its exit part when ``t_exit`` is set, the
    check word binds it to the record and the state is an exit state. Anything else non-blank
    counts as torn, as in a write cut off by a kill (``check``)."""
    slots = np.asarray(slots)
    verdict = check(records, slots, capacity)
    trusted = verdict >= ENTERED
    good, good_slots = _keep(records, slots, trusted)
    has_exit = verdict[trusted] == EXITED
    torn = np.sort(slots[(verdict == DAMAGED) | (verdict == CUT_EXIT)])
    gidx = good["idx"]
    if len(gidx) > 1 and not bool((gidx[1:] > gidx[:-1]).all()):  # lapped: by index
        order = np.argsort(gidx, kind="stable")
        good, has_exit, good_slots = good[order], has_exit[order], good_slots[order]
    return Decoded(good, has_exit, good_slots, torn)


def _keep(rows: np.ndarray, slots: np.ndarray, mask: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``rows[mask], slots[mask]``, without a copy when the kept rows are one run (the common
    case: a ring not yet full ends in blank slots)."""
    at = np.flatnonzero(mask)
    if not len(at):
        return rows[:0], slots[:0]
    lo, hi = int(at[0]), int(at[-1]) + 1
    if hi - lo == len(at):
        return rows[lo:hi], slots[lo:hi]
    return rows[mask], slots[mask]


_KIND = {int(k): k for k in EventKind}
_FUNCTIONAL = int(EventFlag.FUNCTIONAL)
_STATE = {int(k): k for k in EventState}
_DEFAULTS = {f.name: f.default for f in dataclasses.fields(Event)
             if f.default is not dataclasses.MISSING}


def _event(values: dict) -> Event:
    """An ``Event`` of ``values`` (every field without a default). ``Event`` is a frozen
    dataclass, whose ``__init__`` sets each of its 24 fields through ``object.__setattr__``: 10 us
    an event, seconds for a large capture. This fills the instance's ``__dict__`` at once (1 us);
    the instance is the same (equal, same hash) as ``Event(**values)`` makes."""
    e = object.__new__(Event)
    e.__dict__.update(_DEFAULTS)
    e.__dict__.update(values)
    return e


_NEW = object.__new__
_SET = object.__setattr__


def events(decoded: Decoded, strings: Mapping[int, str], paths: bool = True) -> list[Event]:
    """The typed events of ``decoded``'s rows (strings: id -> text). ``paths``: the records
    name their call paths (format 2 on; in version 1 the field meant something else).

    What a call is - its op, group, tensors, places, path, peer, kind and flags - is made once
    per distinct combination of the rank's ids, as the fields of an ``Event`` (``_event``'s
    ``__dict__``); each record's event is a copy of those with its own numbers and end."""
    out: list[Event] = []
    get = strings.get
    places: dict[tuple[int, int, int], Location | None] = {(0, 0, 0): None}
    call_paths: dict[int, tuple[Location, ...]] = {0: ()}
    kinds: dict[tuple, dict] = {}
    rows = decoded.rows.tolist()
    exited = decoded.exited.tolist()
    entered = EventState.ENTERED
    for row, done in zip(rows, exited):
        (idx, parent, t_enter, seq, nbytes, thread, op, group, inp, outp, uf, ul, ufn, af, al,
         path, peer, gsize, seq_off, kind, flags, _p, _c, _p2, t_exit, delta, state, _x) = row
        what = (op, group, inp, outp, uf, ul, ufn, af, al, path, peer, gsize, seq_off, kind,
                flags)
        fields = kinds.get(what)
        if fields is None:
            user, api = (uf, ul, ufn) if uf else (0, 0, 0), (af, al, 0) if af else (0, 0, 0)
            for place in (user, api):
                if place not in places:
                    places[place] = Location(get(place[0], "<?>"), place[1], get(place[2], ""))
            if not paths:
                path = 0
            call_path = call_paths.get(path)
            if call_path is None:
                call_path = call_paths[path] = _call_path(get(path), get)
            fields = kinds[what] = {
                **_DEFAULTS, "kind": _KIND[kind], "op": get(op, "<?>"),
                "group": get(group, "<?>"), "seq_offset": seq_off, "flags": EventFlag(flags),
                "input": get(inp, ""), "output": get(outp, ""), "peer": peer,
                "group_size": gsize, "callsite": places[user], "api_callsite": places[api],
                "path": call_path,
                "source": EventSource.FUNCTIONAL if flags & _FUNCTIONAL else EventSource.RECORDER,
            }
        values = fields.copy()
        values["idx"], values["parent"], values["seq"] = idx, parent, seq
        values["t_enter_ns"], values["thread"], values["nbytes"] = t_enter, thread, nbytes
        if done:
            values["seq_delta"], values["state"], values["t_exit_ns"] = delta, _STATE[state], t_exit
        else:
            values["seq_delta"], values["state"], values["t_exit_ns"] = None, entered, None
        e = _NEW(Event)
        _SET(e, "__dict__", values)
        out.append(e)
    return out


def _call_path(text: str | None, get: Callable[..., str | None]) -> tuple[Location, ...]:
    """The frames of a call path's text (rank/recorder/arguments.path_text: ``file:line:function``
    ids, then ``:flags`` on a frame that has some - ``p`` passes its call on, ``t`` called by
    torch; older captures have none): a frame that does not parse, or names a
    string the table does not hold, ends the path there."""
    frames = []
    for part in (text or "").split():
        fields = part.split(":")
        flags = fields.pop() if len(fields) == 4 else ""
        if len(fields) != 3 or not all(f.isdigit() for f in fields):
            break
        file = get(int(fields[0]))
        if not file:
            break
        frames.append(Location(file, int(fields[1]), get(int(fields[2])) or "",
                               passes_on="p" in flags, from_torch="t" in flags))
    return tuple(frames)


_NAMED = ("op", "group", "input", "output", "ufile", "ufunc", "afile", "path")


def unresolved(rows: np.ndarray, strings: Mapping[int, str]) -> np.ndarray:
    """bool per row: it names a string id the table does not hold (yet: a record written after
    the table was read; or a damaged table)."""
    known = np.fromiter(strings, dtype=np.int64, count=len(strings))
    out = np.zeros(len(rows), dtype=bool)
    for col in _NAMED:
        out |= ~np.isin(rows[col].astype(np.int64), known)
    return out
