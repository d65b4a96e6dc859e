"""Parsing a capture file's header, metadata, string table and exit notes (the ring's records:
capture/records.py; reading a whole capture, fresh or followed: capture/follow.py), and a whole
capture read at once with its records as columns (``read_columns``: what replay and the tables
read).

Never executes anything from the file; every field is bounds- and checksum-checked. Raises
``NotACapture`` / ``UnsupportedVersion`` / ``CorruptCapture`` for files it cannot use at all; a file
that is only partly damaged loads, with the damage described in ``RankTrace.integrity``.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

from nccl_doctor import bounded_json
from nccl_doctor.files import read_regular
from nccl_doctor import paths
from nccl_doctor.capture import format as fmt, records
from nccl_doctor.errors import CorruptCapture, NotACapture, UnsupportedVersion
from nccl_doctor.model import (
    Integrity, Location, ExitKind, RankExit, RankMeta,
)


def read_header(data: bytes, path: Path) -> tuple[int, ...]:
    """(capacity, ring offset, string-table offset and size, created, format version)."""
    if data[:8] != fmt.MAGIC:
        raise NotACapture(f"{path} is not an nccl-doctor capture file (no capture header)")
    if len(data) < fmt.HEADER.size:
        raise CorruptCapture(f"{path} is truncated inside its header: the file cannot be read")
    magic, version, header_size, record_size, capacity, ring_off, str_off, str_size, created = (
        fmt.HEADER.unpack_from(data, 0)
    )
    if version not in fmt.READABLE_VERSIONS:
        raise UnsupportedVersion(
            f"{path} is capture format version {version}, this nccl-doctor reads versions "
            f"{fmt.readable_versions()}: replay it with the nccl-doctor release that recorded it"
        )
    if (
        header_size != fmt.HEADER_SIZE
        or record_size != fmt.RECORD_SIZE
        or capacity <= 0
        or str_off != fmt.HEADER_SIZE
        or ring_off != str_off + str_size
    ):
        raise CorruptCapture(f"{path} has a damaged capture header: the file cannot be read")
    return capacity, ring_off, str_off, str_size, created, version


def read_meta(data: bytes, path: Path) -> dict[str, Any]:
    if len(data) < fmt.HEADER_SIZE:
        raise CorruptCapture(f"{path} is truncated inside its header: the file cannot be read")
    length, crc = fmt.META_HEAD.unpack_from(data, fmt.META_OFFSET)
    start = fmt.META_OFFSET + fmt.META_HEAD.size
    raw = data[start : start + length]
    if length > fmt.META_MAX or fmt.crc32(raw) != crc:
        raise CorruptCapture(f"{path} has corrupt metadata (CRC mismatch): the file cannot be read")
    try:
        meta = bounded_json.loads(raw)
    except ValueError:
        raise CorruptCapture(f"{path} has unreadable metadata: the file cannot be read") from None
    if not isinstance(meta, dict) or not isinstance(meta.get("rank"), int):
        raise CorruptCapture(f"{path} has metadata without a rank: the file cannot be read")
    return meta


def read_progress(path: Path) -> tuple[dict[str, Any], int]:
    """(metadata, records started) of a capture, from its header alone: cheap enough to poll."""
    meta, started, _ = read_counters(path)
    return meta, started


def read_counters(path: Path) -> tuple[dict[str, Any], int, int]:
    """(metadata, records started, string-table bytes used) from the header alone: the second
    counter moves when the rank writes a note (silent-error hashes, lifecycle)."""
    try:
        with path.open("rb") as fh:
            data = fh.read(fmt.HEADER_SIZE)
    except OSError as err:
        raise CorruptCapture(f"{path} cannot be read ({err.strerror})") from None
    read_header(data, path)
    meta = read_meta(data, path)
    (started,) = fmt.COUNTER.unpack_from(data, fmt.EVENTS_STARTED_OFFSET)
    (used,) = fmt.COUNTER.unpack_from(data, fmt.STRTAB_USED_OFFSET)
    return meta, started, used


def parse_strings(data: bytes, pos: int, strings: dict[int, str],
                  notes: list[dict[str, Any]]) -> tuple[int, int, bool]:
    """Parse string-table entries of ``data`` (the table's bytes in use) from ``pos`` on into
    ``strings`` and ``notes``. Returns (where parsing stopped, notes that were not JSON, whether
    it stopped at a damaged entry - a reader may resume from there once more is written)."""
    bad_json = 0
    end = len(data)
    while pos + fmt.STR_HEAD.size <= end:
        length, kind, sid = fmt.STR_HEAD.unpack_from(data, pos)
        if length == 0 and kind == 0:
            break
        body_end = pos + fmt.STR_HEAD.size + length
        if body_end + fmt.CRC.size > end:
            return pos, bad_json, True
        body = data[pos + 4 : body_end]
        (crc,) = fmt.CRC.unpack_from(data, body_end)
        if fmt.crc32(body) != crc:
            return pos, bad_json, True  # lengths after a corrupt entry cannot be trusted
        pos = body_end + fmt.CRC.size
        payload = body[8:].decode("utf-8", "replace")
        if kind == fmt.StrKind.STRING:
            strings[sid] = payload
        elif kind == fmt.StrKind.NOTE:
            try:
                note = _note(payload)
            except ValueError:
                bad_json += 1
                continue
            if isinstance(note, dict):
                notes.append(note)
    return pos, bad_json, False


def _note(payload: str) -> Any:
    """A note's JSON, within bounded_json's bounds. A note with no more brackets than the depth
    allowed cannot nest deeper: it is parsed without walking the value for its depth (a group
    note of a 1,024-rank world lists 1,024 ranks, in every rank's capture)."""
    if (len(payload) <= bounded_json.MAX_BYTES
            and payload.count("[") + payload.count("{") <= bounded_json.MAX_DEPTH):
        return json.loads(payload)  # (a ValueError as bounded_json's: not JSON)
    return bounded_json.loads(payload)


def ring_slots(capacity: int, started: int, available: int) -> int:
    """How many slots from the ring's start can hold records: all of them once the ring has
    lapped; before that the records started so far (the header's counter) and a few beyond it
    (a thread of the pure-Python ring may publish its count after a later one's)."""
    if started <= 0 or started >= capacity:
        return min(capacity, available)
    return min(capacity, available, started + LOOKAHEAD)


#: Slots read past the header's counter (records started by threads racing the counter).
LOOKAHEAD = 64


_FAULT_SIGNALS = {
    "Aborted": "SIGABRT", "Segmentation fault": "SIGSEGV", "Bus error": "SIGBUS",
    "Floating point exception": "SIGFPE", "Illegal instruction": "SIGILL",
}
_FRAME_RE = re.compile(r'^\s*File "(.+)", line (\d+) in (.+)$')


def parse_fault(text: str) -> tuple[str, Location | None] | None:
    """Signal name and innermost user frame from a faulthandler dump (None if no fault)."""
    m = re.search(r"Fatal Python error: ([^\n]+)", text)
    if not m:
        return None
    reason = m.group(1).strip()
    signal = _FAULT_SIGNALS.get(reason, reason)
    current = text.split("Current thread", 1)[-1] if "Current thread" in text else text
    site = None
    for line in current.splitlines():
        fm = _FRAME_RE.match(line)
        if fm and not paths.is_library_file(fm.group(1)):
            site = Location(fm.group(1), int(fm.group(2)), fm.group(3).strip())
            break  # faulthandler lists the most recent call first
    return signal, site


def _exit_from(notes: list[dict[str, Any]], fault_text: str | None) -> RankExit:
    fault = parse_fault(fault_text) if fault_text else None
    by_kind = {n.get("note"): n for n in notes}
    exc = by_kind.get("exception")
    if exc is not None:
        # sys.excepthook runs as the main thread ends, and a fatal signal leaves no time for
        # one: an exception recorded beside a fault came first, and the fault (a gloo/NCCL
        # destructor's SIGABRT in interpreter teardown) is its aftermath, kept as ``signal``
        site = None
        if isinstance(exc.get("path"), str) and isinstance(exc.get("line"), int):
            site = Location(exc["path"], exc["line"], str(exc.get("function", "")))
        return RankExit(
            ExitKind.EXCEPTION, code=1, exception=f"{exc.get('type')}: {exc.get('message')}",
            signal=fault[0] if fault else None, callsite=site, time_ns=exc.get("time_ns"),
        )
    if fault is not None:
        return RankExit(ExitKind.SIGNAL, signal=fault[0], callsite=fault[1])
    code = by_kind.get("sys_exit", {}).get("code")
    ext = by_kind.get("exit")
    if ext is not None:
        return RankExit(
            ExitKind.CLEAN, code=code if isinstance(code, int) else 0, time_ns=ext.get("time_ns"),
        )
    return RankExit(ExitKind.RUNNING)


def _meta(meta: dict[str, Any]) -> RankMeta:
    def opt_int(key: str) -> int | None:
        v = meta.get(key)
        return v if isinstance(v, int) else None

    return RankMeta(
        rank=meta["rank"], world_size=opt_int("world_size") or 0,
        local_rank=opt_int("local_rank"), node_rank=opt_int("node_rank"),
        host=str(meta.get("host", "")), pid=opt_int("pid") or 0,
        started_ns=opt_int("started_ns") or 0, run_id=str(meta.get("run_id", "")),
        argv=tuple(str(a) for a in meta.get("argv", ()) or ()),
        versions={str(k): str(v) for k, v in (meta.get("versions") or {}).items()},
        env={str(k): str(v) for k, v in (meta.get("env") or {}).items()},
        ray=_strings(meta.get("ray")),
        prefixes=tuple(str(p) for p in meta.get("prefixes") or () if isinstance(p, str))[:8],
    )


def with_code_notes(meta: RankMeta, notes: list[dict[str, Any]] | tuple) -> RankMeta:
    """``meta`` with what the rank noted of the code on its call paths (rank/recorder/
    arguments.py ``_note_file``): each file's fingerprint and each package's version."""
    versions, sources = dict(meta.versions), dict(meta.sources)
    for note in notes:
        if note.get("note") != "code":
            continue
        for key, into in (("versions", versions), ("sources", sources)):
            got = note.get(key)
            if isinstance(got, dict):
                for k, v in got.items():
                    if isinstance(k, str) and isinstance(v, str):
                        into.setdefault(k[:4096], v[:200])
    if len(versions) == len(meta.versions) and len(sources) == len(meta.sources):
        return meta
    return replace(meta, versions=versions, sources=sources)


def _strings(raw: Any) -> dict[str, str]:
    """A small str -> str mapping of the metadata ({} for anything else)."""
    if not isinstance(raw, dict):
        return {}
    return {str(k)[:64]: str(v)[:200] for k, v in list(raw.items())[:16]}


def read_fault(path: Path) -> str | None:
    """The faulthandler output beside a capture file (bounded), if any."""
    fault_path = path.with_suffix(fmt.FAULT_SUFFIX)
    try:
        return read_regular(fault_path, 4_000_000).decode("utf-8", "replace")[:1_000_000]
    except OSError:  # absent, unreadable, or not a regular file
        return None


# -- a whole capture, its records as columns --------------------------------------------------

@dataclass(frozen=True)
class CaptureColumns:
    """A capture read whole, its trusted records as columns (one contiguous array per field of
    records.FIELDS, by ascending index), with what ``follow.scan_capture`` says of it: the same
    metadata, strings, notes, integrity and end (a test holds the two readers to that). The
    bulk readers - replay's, ``nccl_doctor.open``'s tables, ``export`` - read through this: one
    pass over the file's bytes (records.read_ring), no row of 128 bytes kept."""

    path: Path
    meta: RankMeta
    strings: dict[int, str]
    notes: tuple[dict[str, Any], ...]
    cols: dict[str, np.ndarray]  # records.FIELDS -> one value per record
    exited: np.ndarray  # bool per record: its exit part is valid (else it reads ENTERED)
    slots: np.ndarray  # the ring slot of each record
    torn_slots: np.ndarray  # slots holding a damaged record or a record's damaged exit part
    integrity: Integrity
    exit: RankExit
    paths: bool  # its records name their call paths (format 2 on)
    capacity: int  # the ring's slots, and where it starts in the file (to read slots again)
    ring_offset: int

    def __len__(self) -> int:
        return len(self.exited)

    def rows(self, at: np.ndarray | None = None) -> np.ndarray:
        """The records (of positions ``at``) as records.RECORD rows, their checks left 0."""
        at = np.arange(len(self)) if at is None else at
        out = np.zeros(len(at), dtype=records.RECORD)
        for name, col in self.cols.items():
            out[name] = col[at]
        return out


def read_columns(path: Path, fields: tuple[str, ...] = records.FIELDS, *,
                 recent: int) -> CaptureColumns:
    """One capture file (and its faulthandler file beside it, if any), its records as columns:
    ``follow.CaptureFollower.scan``'s reading, step by step, with the ring read and checked
    by records.read_ring. ``fields``: the columns wanted (every record still checked whole;
    ``rows`` needs them all); ``recent``: follow.RECENT, the records from the ring's head a
    kill may leave torn or blank (passed in: follow imports this module)."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError as err:
        raise CorruptCapture(f"{path} cannot be read: {err.strerror}") from None
    try:
        return _read_columns(path, fd, tuple(dict.fromkeys(("idx", *_NAMED, *fields))), recent)
    except OSError as err:
        raise CorruptCapture(f"{path} cannot be read: {err.strerror}") from None
    finally:
        os.close(fd)


_NAMED = ("op", "group", "input", "output")


def _read_columns(path: Path, fd: int, fields: tuple[str, ...], recent: int) -> CaptureColumns:
    head = os.pread(fd, fmt.HEADER_SIZE, 0)
    size = os.fstat(fd).st_size
    capacity, ring_off, str_off, str_size, _, version = read_header(head, path)
    meta = _meta(read_meta(head, path))
    available = max(0, size - ring_off) // fmt.RECORD_SIZE  # slots in the file
    expected = ring_off + capacity * fmt.RECORD_SIZE
    truncated = size < expected
    (started,) = fmt.COUNTER.unpack_from(head, fmt.EVENTS_STARTED_OFFSET)
    (used,) = fmt.COUNTER.unpack_from(head, fmt.STRTAB_USED_OFFSET)
    miscounted = False
    if used < str_size:  # an entry begins where the counter says the table ends: it stops short
        entry = os.pread(fd, fmt.STR_HEAD.size, str_off + used)
        if len(entry) == fmt.STR_HEAD.size and any(entry):
            used, miscounted = str_size, True
    strings: dict[int, str] = {0: ""}
    notes: list[dict[str, Any]] = []
    stop, bad_json, str_damaged = 0, 0, False
    if min(used, str_size) > 0:
        data = os.pread(fd, min(used, str_size), str_off)
        stop, bad_json, str_damaged = parse_strings(data, 0, strings, notes)
    blanked = stop < min(used, str_size)  # blank entries below the counter
    fault_text = read_fault(path)  # (None: none beside it)
    end = ring_slots(capacity, started, available)
    if end < available:  # records past the counter
        past = records.read_ring(fd, ring_off + end * fmt.RECORD_SIZE, end,
                                 min(8, available - end), capacity, ("idx",))
        if len(past.exited):
            end, miscounted = available, True
    split = records.read_ring(fd, ring_off, 0, end, capacity, fields)
    cols, exited, slots = split.cols, split.exited, split.slots
    torn = np.flatnonzero((split.verdicts == records.DAMAGED)
                          | (split.verdicts == records.CUT_EXIT)).astype(np.int64)
    idx = cols["idx"]
    if len(idx) > 1 and not bool((idx[1:] > idx[:-1]).all()):  # lapped: by index
        order = np.argsort(idx, kind="stable")
        cols = {name: col[order] for name, col in cols.items()}
        exited, slots = exited[order], slots[order]
    # a record naming strings the table does not hold (its entries lost) cannot be told from
    # another call: it is skipped, and counted. A table of ids 0..n-1 (as the writer numbers
    # them) holds every id below n: its records are looked up only when one names n or more.
    unnamed = 0
    dense = max(strings) == len(strings) - 1
    if len(exited) and (not dense or max(int(cols[name].max()) for name in _NAMED)
                        >= len(strings)):
        ids = np.fromiter(strings, dtype=np.int64, count=len(strings))
        named = np.ones(len(exited), dtype=bool)
        for name in _NAMED:
            named &= np.isin(cols[name], ids)
        unnamed = int(len(named) - named.sum())
    if unnamed:
        cols = {name: col[named] for name, col in cols.items()}
        exited, slots = exited[named], slots[named]
    count = int(cols["idx"][-1]) if len(exited) else 0
    bad = bad_json + (1 if str_damaged or blanked else 0)
    # the slots below the newest record (or the counter) hold a record each: blank ones lost
    # theirs (zeroed)
    seen = np.zeros(max(available, 1), dtype=bool)
    seen[slots] = True
    seen[torn] = True
    filled = min(max(count, started), capacity, available)
    blank = max(0, filled - int(seen.sum()))
    # a kill leaves its torn or blank records at the head of the ring (the calls in flight);
    # one further back was damaged later
    head_slot = (count - 1) % capacity if count else 0
    odd = np.concatenate([torn, np.flatnonzero(~seen[:min(filled, available)])])
    deep = int(((head_slot - odd) % capacity > recent).sum()) if count else 0
    ended = _exit_from(notes, fault_text)
    if ended.kind in (ExitKind.CLEAN, ExitKind.EXCEPTION):
        deep = len(odd)  # it ended by itself, no call in flight: none was cut by a kill
    integrity = Integrity(len(torn), truncated, max(0, count - capacity), bad,
                          *((size, expected) if truncated else (0, 0)),
                          miscounted=miscounted or size > expected, blank_records=blank,
                          unnamed_records=unnamed, deep_damage=deep)
    return CaptureColumns(path, with_code_notes(meta, notes), dict(strings), tuple(notes), cols,
                          exited, slots, torn, integrity, ended, version >= fmt.PATHS_SINCE,
                          capacity, ring_off)
