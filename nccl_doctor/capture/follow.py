"""Following a capture while its rank writes it: each read costs the records written since the
last one, not the ring.

A ``CaptureFollower`` keeps what it decoded, slot by slot. Each ``read`` looks at the header's
two counters (records started, string-table bytes used) and re-decodes only the slots that can
have changed since: those of the records started since (and a few beyond the counter, where a
racing thread of the pure-Python ring may already have written), records whose exit part is not
written yet (calls still running), and slots that were torn or referenced strings not yet read
(a write caught half done). A slot whose record and exit both hold never changes until the ring
laps it, which the counter says. When the reader falls a whole lap behind it decodes the ring
afresh. The result is the same ``RankTrace`` a fresh read of the file gives at that moment, and
the same object as the previous read when nothing changed (callers may cache on identity).

``read_capture`` is a follower's first read: one implementation for replay and live.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from nccl_doctor.capture import format as fmt, records, window
from nccl_doctor.capture.reader import (
    LOOKAHEAD, _exit_from, _meta, parse_strings, read_fault, read_header, read_meta, ring_slots,
    with_code_notes,
)
from nccl_doctor.errors import CorruptCapture
from nccl_doctor.model import Event, ExitKind, Integrity, RankExit, RankMeta, RankTrace

#: Records the frontier may trail the counter by before a slot still not written there is taken
#: for torn (re-read on each read until the ring laps it) and the frontier moves on.
RECENT = 16  # records from the ring's head a kill may leave torn or blank (the calls in flight)
_PATIENCE = 4 * LOOKAHEAD


class CaptureFollower:
    """One capture file, followed. ``read()`` -> the ``RankTrace`` now; ``close()`` when done."""

    def __init__(self, path: Path) -> None:
        self.path = path
        try:
            self._fd = os.open(path, os.O_RDONLY)
        except OSError as err:
            raise CorruptCapture(f"{path} cannot be read: {err.strerror}") from None
        try:
            head = os.pread(self._fd, fmt.HEADER_SIZE, 0)
            size = os.fstat(self._fd).st_size
        except OSError as err:
            self.close()
            raise CorruptCapture(f"{path} cannot be read: {err.strerror}") from None
        try:
            capacity, ring_off, str_off, str_size, _, version = read_header(head, path)
            self._meta = self._meta_now = _meta(read_meta(head, path))
            self._meta_notes = 0
        except Exception:
            self.close()
            raise
        self.capacity, self._ring_off = capacity, ring_off
        self._paths = version >= fmt.PATHS_SINCE  # its records name their call paths
        self._str_off, self._str_size = str_off, str_size
        self._available = max(0, size - ring_off) // fmt.RECORD_SIZE  # slots in the file
        self._size, self._expected = size, ring_off + capacity * fmt.RECORD_SIZE
        self._truncated = size < self._expected
        # strings and notes, parsed up to ``_str_pos`` (the table only grows)
        self._strings: dict[int, str] = {0: ""}
        self._notes: list[dict[str, Any]] = []
        self._str_pos, self._bad_json, self._str_damaged = 0, 0, False
        # the ring, slot by slot, as columns: the one form the records are held in; ``Event``s
        # are views made for the trace ``read`` returns, remade only for the slots decoded
        # since (``_dirty``), the rest taken from the previous trace (``_built``: their idx)
        self._cols = np.zeros(self._available, dtype=records.RECORD)
        self._exited = np.zeros(self._available, dtype=bool)
        self._held = np.zeros(self._available, dtype=bool)
        self._dirty: set[int] = set()
        self._built: tuple[np.ndarray, tuple[Event, ...]] = (np.zeros(0, dtype=np.uint64), ())
        self._torn: set[int] = set()  # slots holding a torn record (or a torn exit part)
        self._open: set[int] = set()  # slots whose record awaits its exit, or a string
        self._last_decode: tuple[bytes, bytes, int] | None = None  # (slots, rows, strings)
        self._frontier = 1  # lowest record index not yet seen in its slot
        self._started = -1
        self._used = -1
        self._fault: tuple[int, int] | None = None  # (size, mtime) of the fault file
        self._fault_text: str | None = None
        self._trace: RankTrace | None = None

    def __enter__(self) -> CaptureFollower:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1

    # -- reading --------------------------------------------------------------------------
    def scan(self) -> Scan:
        """The whole capture now, read afresh, its records still columns (nothing kept)."""
        started, used = self._counters()
        miscounted = False
        if used < self._str_size and self._str_head_at(used):  # the counter stops short
            used, miscounted = self._str_size, True
        self._read_strings(used)
        blanked = self._str_pos < min(used, self._str_size)  # blank entries below the counter
        self._read_fault()
        end = ring_slots(self.capacity, started, self._available)
        if end < self._available and len(self._valid(end)):  # records past the counter
            end, miscounted = self._available, True
        slots = np.arange(end)
        decoded = records.decode(self._rows(slots), slots, self.capacity)
        # a record naming strings the table does not hold (its entries lost) cannot be told
        # from another call: it is skipped, and counted
        ids = np.fromiter(self._strings, dtype=np.int64, count=len(self._strings))
        rows = decoded.rows
        named = (np.isin(rows["op"], ids) & np.isin(rows["group"], ids)
                 & np.isin(rows["input"], ids) & np.isin(rows["output"], ids))
        unnamed = int(len(named) - named.sum())
        if unnamed:
            decoded = records.Decoded(decoded.rows[named], decoded.exited[named],
                                      decoded.slots[named], decoded.torn_slots)
        count = int(decoded.rows["idx"][-1]) if len(decoded.rows) else 0
        bad = self._bad_json + (1 if self._str_damaged or blanked else 0)
        # the slots below the newest record (or the counter) hold a record each: blank ones
        # lost theirs (zeroed)
        seen = np.zeros(max(self._available, 1), dtype=bool)  # (a mask: no sort of the slots)
        seen[decoded.slots] = True
        seen[decoded.torn_slots] = True
        seen_count = int(seen.sum())
        filled = min(max(count, started), self.capacity, self._available)
        blank = max(0, filled - seen_count)
        # a kill leaves its torn or blank records at the head of the ring (the calls in flight);
        # one further back was damaged later
        head = (count - 1) % self.capacity if count else 0
        blank_slots = np.flatnonzero(~seen[:min(filled, self._available)])
        odd = np.concatenate([decoded.torn_slots, blank_slots]).astype(np.int64)
        deep = int(((head - odd) % self.capacity > RECENT).sum()) if count else 0
        ended = _exit_from(self._notes, self._fault_text)
        if ended.kind in (ExitKind.CLEAN, ExitKind.EXCEPTION):
            deep = len(odd)  # it ended by itself, no call in flight: none was cut by a kill
        return Scan(self.path, self.meta, dict(self._strings), tuple(self._notes), decoded,
                    self._integrity(decoded.torn, count, bad, miscounted, blank, unnamed, deep),
                    ended, self._paths)

    def _str_head_at(self, used: int) -> bool:
        """Whether an entry begins where the string table's counter says it ends."""
        head = self._pread(fmt.STR_HEAD.size, self._str_off + used)
        return len(head) == fmt.STR_HEAD.size and any(head)

    def _valid(self, slot: int) -> np.ndarray:
        """The records that pass their checks in the few slots from ``slot`` on."""
        slots = np.arange(slot, min(slot + 8, self._available))
        return records.decode(self._rows(slots), slots, self.capacity).rows

    def _integrity(self, torn: int, count: int, bad: int, miscounted: bool = False,
                   blank: int = 0, unnamed: int = 0, deep: int = 0) -> Integrity:
        return Integrity(torn, self._truncated, max(0, count - self.capacity), bad,
                         *((self._size, self._expected) if self._truncated else (0, 0)),
                         miscounted=miscounted or self._size > self._expected,
                         blank_records=blank, unnamed_records=unnamed, deep_damage=deep)

    def columns(self) -> Scan:
        """The capture as last read (``read``), its records as columns, from what this follower
        holds: nothing is read or decoded again."""
        trace = self.read()
        slots = np.flatnonzero(self._held)
        rows = self._cols[slots]
        order = np.argsort(rows["idx"], kind="stable")
        slots = slots[order]
        decoded = records.Decoded(rows[order], self._exited[slots], slots,
                                  np.array(sorted(self._torn), dtype=np.int64))
        return Scan(self.path, self.meta, dict(self._strings), tuple(self._notes), decoded,
                    trace.integrity, trace.exit, self._paths, held=trace)

    def _counters(self) -> tuple[int, int]:
        """(records started, string-table bytes used): the header's two live counters."""
        head = self._pread(fmt.EVENTS_STARTED_OFFSET + 16, 0)
        (started,) = fmt.COUNTER.unpack_from(head, fmt.EVENTS_STARTED_OFFSET)
        (used,) = fmt.COUNTER.unpack_from(head, fmt.STRTAB_USED_OFFSET)
        return started, used

    def read(self, moved_folder: bool = True) -> RankTrace:
        """The capture as it is now (the previous object when nothing changed).
        ``moved_folder``: whether its folder may hold new files (False: a fault file that was
        not there is still not there, and is not looked for)."""
        started, used = self._counters()
        changed = self._read_strings(used)
        changed |= self._read_ring(started)
        if moved_folder or self._fault is not None:
            changed |= self._read_fault()
        if changed or self._trace is None:
            self._trace = self._build()
        return self._trace

    def _pread(self, length: int, offset: int) -> bytes:
        try:
            return os.pread(self._fd, length, offset)
        except OSError as err:
            raise CorruptCapture(f"{self.path} cannot be read: {err.strerror}") from None

    def _read_strings(self, used: int) -> bool:
        if used == self._used and not self._str_damaged:
            return False
        self._used = used
        end = min(used, self._str_size)
        if end <= self._str_pos:
            return False
        data = self._pread(end - self._str_pos, self._str_off + self._str_pos)
        known = len(self._strings)
        before = (known, len(self._notes), self._str_damaged)
        pos, bad_json, damaged = parse_strings(data, 0, self._strings, self._notes)
        self._str_pos += pos
        self._bad_json += bad_json
        self._str_damaged = damaged
        return (len(self._strings), len(self._notes), damaged) != before or bad_json > 0

    def _read_ring(self, started: int) -> bool:
        capacity = self.capacity
        if self._started < 0 or started - self._frontier >= capacity:  # first read, or a lap
            self._held[:] = False
            self._torn.clear()
            self._open.clear()
            self._last_decode = None  # (what was held is forgotten: everything decoded anew)
            self._started = started
            self._frontier = started - capacity + 1 if started >= capacity else 1
            self._decode(np.arange(ring_slots(capacity, started, self._available)))
            self._advance(started)
            return True
        moved, self._started = started != self._started, started
        pending = np.fromiter(sorted(self._open | self._torn), dtype=np.int64)
        if moved:
            # the records started since (and a few past the counter: a racing thread of the
            # pure-Python ring may have written there; it publishes its own index once it has,
            # so while the counter stands still nothing new was written), and the unsettled slots
            upto = min(started + LOOKAHEAD, self._frontier + capacity - 1)
            fresh = np.arange(self._frontier, upto + 1, dtype=np.int64)
            slots = np.union1d((fresh - 1) % capacity, pending)
        else:  # (the watchdog's looks while ranks wait: only the unsettled slots)
            slots = pending
        changed = self._decode(slots[slots < self._available])
        self._advance(started)
        return changed

    def _advance(self, started: int) -> None:
        """Move the frontier past every record seen in its own slot. A slot that stays
        unwritten far behind the counter was cut off (a thread killed in the middle of its
        write): it is looked at again on each read until the ring laps it."""
        while self._frontier <= started + LOOKAHEAD:
            slot = (self._frontier - 1) % self.capacity
            if (slot < self._available and self._held[slot]
                    and int(self._cols["idx"][slot]) == self._frontier):
                self._frontier += 1
            elif started - self._frontier >= _PATIENCE:
                if slot < self._available:
                    self._open.add(slot)
                self._frontier += 1
            else:
                break

    def _decode(self, slots: np.ndarray) -> bool:
        """Decode ``slots`` afresh; whether what they hold changed. The same slots read back
        byte for byte as last time, with no string learnt since, decode to what they did: not
        decoded again (the watchdog's looks while ranks wait in a call: each rank's open record,
        read again and again)."""
        if not len(slots):
            return False
        rows = self._rows(slots)
        same_as_last = (slots.tobytes(), rows.tobytes(), len(self._strings))
        if same_as_last == self._last_decode:
            return False
        self._last_decode = same_as_last
        decoded = records.decode(rows, slots, self.capacity)
        touched = slots.tolist()
        before = (self._held[slots].copy(), self._exited[slots].copy(),
                  self._cols[slots].view(np.uint8).copy())
        torn_before = self._torn.intersection(touched)
        self._open.difference_update(touched)
        self._torn.difference_update(touched)
        self._torn.update(decoded.torn_slots.tolist())
        missing = records.unresolved(decoded.rows, self._strings)
        self._held[slots] = False
        self._cols[decoded.slots] = decoded.rows
        self._exited[decoded.slots] = decoded.exited
        self._held[decoded.slots] = True
        # its exit, or a name, is still to come
        self._open.update(decoded.slots[~decoded.exited | missing].tolist())
        self._dirty.update(decoded.slots.tolist())
        held, exited = self._held[slots], self._exited[slots]
        same = (held == before[0]) & (~held | ((exited == before[1]) & (
            self._cols[slots].view(np.uint8).reshape(len(slots), -1)
            == before[2].reshape(len(slots), -1)).all(axis=1)))
        return torn_before != self._torn.intersection(touched) or not bool(same.all())

    def _rows(self, slots: np.ndarray) -> np.ndarray:
        """The RECORD rows of ``slots`` (sorted), read in runs of adjacent slots."""
        if len(slots) and int(slots[-1]) - int(slots[0]) + 1 == len(slots):  # one run: no copy
            raw = self._pread(len(slots) * fmt.RECORD_SIZE,
                              self._ring_off + int(slots[0]) * fmt.RECORD_SIZE)
            if len(raw) == len(slots) * fmt.RECORD_SIZE:
                return records.as_records(raw)
        out = np.zeros(len(slots), dtype=records.RECORD)
        if not len(slots):
            return out
        breaks = np.flatnonzero(np.diff(slots) != 1) + 1
        at = 0
        for run in np.split(slots, breaks):
            first, n = int(run[0]), len(run)
            raw = self._pread(n * fmt.RECORD_SIZE, self._ring_off + first * fmt.RECORD_SIZE)
            got = records.as_records(raw)
            out[at:at + len(got)] = got
            if len(got) < n:
                out[at + len(got):at + n] = np.zeros(n - len(got), dtype=records.RECORD)
            at += n
        return out

    def _read_fault(self) -> bool:
        fault_path = self.path.with_suffix(fmt.FAULT_SUFFIX)
        try:
            st = fault_path.stat()
            stamp = (st.st_size, st.st_mtime_ns)
        except OSError:
            stamp = None
        if stamp == self._fault:
            return False
        self._fault = stamp
        self._fault_text = read_fault(self.path) if stamp is not None else None
        return True

    @property
    def meta(self) -> RankMeta:
        """The rank's metadata with what its notes added since (reader.with_code_notes),
        worked out again only when notes came."""
        if self._meta_notes != len(self._notes):
            self._meta_notes = len(self._notes)
            self._meta_now = with_code_notes(self._meta, self._notes)
        return self._meta_now

    def _build(self) -> RankTrace:
        slots = np.flatnonzero(self._held)
        idx = self._cols["idx"][slots]
        order = np.argsort(idx, kind="stable")
        slots, idx = slots[order], idx[order]
        # the previous trace's events where their slots were not decoded since: the same
        # records, the same views
        built, before = self._built
        at = np.minimum(np.searchsorted(built, idx), max(len(built) - 1, 0))
        reuse = np.zeros(len(idx), dtype=bool) if not len(before) else (
            (built[at] == idx) & ~np.isin(slots, np.fromiter(
                self._dirty, dtype=np.int64, count=len(self._dirty))))
        fresh = slots[~reuse]
        made = records.events(records.Decoded(self._cols[fresh], self._exited[fresh], fresh,
                                              np.zeros(0, dtype=np.int64)),
                              self._strings, self._paths)
        views = tuple(_spliced(before, made, reuse, at))
        self._built, self._dirty = (idx, views), set()
        count = int(idx[-1]) if len(idx) else 0
        bad = self._bad_json + (1 if self._str_damaged else 0)
        return RankTrace(
            meta=self.meta, events=views,
            exit=_exit_from(self._notes, self._fault_text),
            integrity=self._integrity(len(self._torn), count, bad),
            path=str(self.path), notes=tuple(self._notes), paths_recorded=self._paths,
        )


def _spliced(before: Sequence[Event], made: list[Event], reuse: np.ndarray,
             at: np.ndarray) -> list[Event]:
    """The events in order: where ``reuse``, ``before[at]``, else the next of ``made`` - in
    runs (a read changes a few slots, mostly at the ring's head: a few slices)."""
    n = len(reuse)
    if not n:
        return []
    cut = np.flatnonzero((reuse[1:] != reuse[:-1]) | (reuse[1:] & (at[1:] != at[:-1] + 1))) + 1
    out: list[Event] = []
    taken = 0
    for lo, hi in zip([0, *cut.tolist()], [*cut.tolist(), n]):
        if reuse[lo]:
            first = int(at[lo])
            out.extend(before[first:first + hi - lo])
        else:
            out.extend(made[taken:taken + hi - lo])
            taken += hi - lo
    return out


@dataclass(frozen=True)
class Scan:
    """A capture read in full with its records still columns: replay of a large job picks the
    rows that become events (capture/window.py) before making any."""

    path: Path
    meta: RankMeta
    strings: dict[int, str]
    notes: tuple[dict[str, Any], ...]
    decoded: records.Decoded
    integrity: Integrity
    exit: RankExit
    paths: bool = True  # its records name their call paths (format 2 on)
    held: RankTrace | None = None  # the same records as events, made before (a follower's)

    def trace(self, keep: np.ndarray | None = None) -> RankTrace:
        """The ``RankTrace``, with every record, or the rows ``keep`` (bool per row) only."""
        held = self.held
        if held is not None:
            if keep is None:
                return held
            kept = set(self.decoded.rows["idx"][keep].tolist())
            return replace(held, events=tuple(e for e in held.events if e.idx in kept),
                           recorded=len(self.decoded.rows),
                           p2p_whole=window.p2p_whole(self.decoded.rows, keep))
        d = self.decoded
        if keep is not None:
            d = records.Decoded(d.rows[keep], d.exited[keep], d.slots[keep], d.torn_slots)
        return RankTrace(meta=self.meta, events=tuple(records.events(d, self.strings, self.paths)),
                         exit=self.exit, integrity=self.integrity, path=str(self.path),
                         notes=self.notes, paths_recorded=self.paths,
                         recorded=None if keep is None else len(self.decoded.rows),
                         p2p_whole=keep is not None and window.p2p_whole(self.decoded.rows, keep))


def scan_capture(path: Path) -> Scan:
    """One capture file (and its faulthandler file beside it, if any), as columns."""
    with CaptureFollower(path) as capture:
        return capture.scan()


def read_capture(path: Path) -> RankTrace:
    """Load one capture file (and its faulthandler file beside it, if any)."""
    return scan_capture(path).trace()
