"""Event records as columns: a ring's bytes -> a numpy structured array, checked in bulk.

The record layout is fixed (nccl_doctor/capture/format.py: ENTER, its Adler-32, EXIT), so a whole
ring decodes as one ``numpy.frombuffer`` with the structured ``RECORD`` dtype, and every check the
reader makes - blank slot, Adler-32 of the enter part, index in its slot, exit check word, known
kind - is one vectorised expression over the column. ``Event`` objects are made only for the rows
a caller asks for (``events``): the analysis passes and the reporters see the typed model, the
bulk of a large capture never becomes Python objects.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Callable, Mapping

import numpy as np

from nccl_doctor.capture import format as fmt
from nccl_doctor.location import Location
from nccl_doctor.model import Event, EventFlag, EventKind, EventSource, EventState

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
    counts as torn, as in a write cut off by a kill."""
    slots = np.asarray(slots)
    words = records.view(np.uint64).reshape(len(records), fmt.RECORD_SIZE // 8)
    written = words.any(axis=1)
    recs, where = _keep(records, slots, written)
    raw = recs.view(np.uint8).reshape(len(recs), fmt.RECORD_SIZE)
    ok = np.empty(len(recs), dtype=bool)
    for lo in range(0, len(recs), _CHUNK):
        ok[lo:lo + _CHUNK] = adler32(raw[lo:lo + _CHUNK, :_ENTER]) == recs["check"][lo:lo + _CHUNK]
    idx = recs["idx"]
    ok &= idx >= 1
    ok &= (idx - np.uint64(1)) % np.uint64(capacity) == where.astype(np.uint64)
    ok &= np.isin(recs["kind"], _KINDS)
    good, good_slots = _keep(recs, where, ok)
    t_exit, check = good["t_exit"], good["exit_check"]
    has_exit = (t_exit != 0) & (exit_check(good) == check) & np.isin(good["state"], _EXIT_STATES)
    cut_exit = ~has_exit & ((t_exit != 0) | (check != 0))
    torn = np.sort(np.concatenate([where[~ok], good_slots[cut_exit]]))
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


def events(decoded: Decoded, strings: Mapping[int, str], paths: bool = True) -> list[Event]:
    """The typed events of ``decoded``'s rows (strings: id -> text). ``paths``: the records
    name their call paths (format 2 on; in version 1 the field meant something else)."""
    out: list[Event] = []
    get = strings.get
    places: dict[tuple[int, int, int], Location | None] = {(0, 0, 0): None}
    call_paths: dict[int, tuple[Location, ...]] = {0: ()}
    flag_of: dict[int, EventFlag] = {}
    rows = decoded.rows.tolist()
    exited = decoded.exited.tolist()
    for row, done in zip(rows, exited):
        (idx, parent, t_enter, seq, nbytes, thread, op, group, inp, outp, uf, ul, ufn, af, al,
         path, peer, gsize, seq_off, kind, flags, _p, _c, _p2, t_exit, delta, state, _x) = row
        user, api = (uf, ul, ufn) if uf else (0, 0, 0), (af, al, 0) if af else (0, 0, 0)
        for place in (user, api):
            if place not in places:
                places[place] = Location(get(place[0], "<?>"), place[1], get(place[2], ""))
        if not paths:
            path = 0
        call_path = call_paths.get(path)
        if call_path is None:
            call_path = call_paths[path] = _call_path(get(path), get)
        flag = flag_of.get(flags)
        if flag is None:
            flag = flag_of[flags] = EventFlag(flags)
        out.append(_event({
            "idx": idx, "parent": parent, "kind": _KIND[kind], "op": get(op, "<?>"),
            "group": get(group, "<?>"), "seq": seq, "seq_offset": seq_off,
            "seq_delta": delta if done else None,
            "state": _STATE[state] if done else EventState.ENTERED, "flags": flag,
            "t_enter_ns": t_enter, "t_exit_ns": t_exit if done else None, "thread": thread,
            "input": get(inp, ""), "output": get(outp, ""), "nbytes": nbytes, "peer": peer,
            "group_size": gsize, "callsite": places[user], "api_callsite": places[api],
            "path": call_path,
            "source": EventSource.FUNCTIONAL if flags & _FUNCTIONAL else EventSource.RECORDER,
        }))
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
