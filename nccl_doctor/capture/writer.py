"""The recorder's side of the capture format: an mmap'd ring buffer and string table.

Everything here runs inside the user's rank. Writing events (``events``, see ring.py) is the hot
path: it packs into the mapping and bumps a counter, with no system call. Only creating the file,
interning a string the first time it is seen and writing a note touch anything else.
"""

from __future__ import annotations

import errno
import json
import mmap
import os
import threading
import time
from pathlib import Path
from typing import Any

from nccl_doctor.capture import format as fmt
from nccl_doctor.capture.ring import make_ring


def _reserve(fd: int, size: int) -> bool:
    """Give the file all its blocks now: True. A file system that cannot reserve blocks
    (EOPNOTSUPP, EINVAL, ENOSYS) leaves it sparse: False. Any other error (no room) is raised."""
    try:
        os.posix_fallocate(fd, 0, size)
    except OSError as err:
        if err.errno in (errno.EOPNOTSUPP, errno.EINVAL, errno.ENOSYS):
            return False
        raise
    return True


class CaptureWriter:
    """Writes one capture file. Events may come from any thread; notes take ``lock``."""

    def __init__(
        self,
        path: Path,
        meta: dict[str, Any],
        *,
        capacity: int = fmt.DEFAULT_RING_RECORDS,
        strtab_bytes: int = fmt.DEFAULT_STRTAB_BYTES,
        preallocate: bool = False,
    ) -> None:
        """``preallocate`` (the recorder's captures): the file's blocks are reserved and every
        page written once here (about 5 ms for 5 MiB, 2.3 s per GiB), so that the hot path
        takes no page fault to allocate the ring - on ext4 the first write to each 4 KiB of a
        sparse ring, one call in 32, cost ~25 us - and a full disk is an OSError here, not a
        SIGBUS in the user's collective call later. Where the file system cannot reserve blocks
        the file stays sparse, as it does without ``preallocate`` (synthetic captures of
        benchmarks and tests)."""
        if capacity < 16:
            raise ValueError(f"ring capacity {capacity} is too small (minimum 16 records)")
        self.path = path
        self.capacity = capacity
        self.strtab_offset = fmt.HEADER_SIZE
        self.strtab_size = strtab_bytes
        self.ring_offset = self.strtab_offset + strtab_bytes
        size = self.ring_offset + capacity * fmt.RECORD_SIZE
        meta_bytes = json.dumps(meta, sort_keys=True, default=str).encode()
        if len(meta_bytes) > fmt.META_MAX:
            raise ValueError(f"capture metadata is {len(meta_bytes)} bytes (max {fmt.META_MAX})")
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o644)
        try:
            os.ftruncate(fd, size)  # sparse, until reserved: pages take space once written
            reserved = preallocate and _reserve(fd, size)
            self._mm = mmap.mmap(fd, size, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
        except OSError:
            path.unlink(missing_ok=True)  # no half-made capture for the supervisor to read
            raise
        finally:
            os.close(fd)
        mm = self._mm
        if reserved:  # (never on unreserved blocks: writing one on a full disk is a SIGBUS)
            for off in range(0, size, mmap.PAGESIZE):  # each page faulted in, writable, now
                mm[off] = mm[off]
        fmt.META_HEAD.pack_into(mm, fmt.META_OFFSET, len(meta_bytes), fmt.crc32(meta_bytes))
        start = fmt.META_OFFSET + fmt.META_HEAD.size
        mm[start : start + len(meta_bytes)] = meta_bytes
        fmt.HEADER.pack_into(
            mm, 0, fmt.MAGIC, fmt.FORMAT_VERSION, fmt.HEADER_SIZE, fmt.RECORD_SIZE, capacity,
            self.ring_offset, self.strtab_offset, strtab_bytes, time.time_ns(),
        )
        # the hot path writes here; it publishes its count in the header for the supervisor
        self.events = make_ring(self._mm, self.ring_offset, capacity, fmt.EVENTS_STARTED_OFFSET)
        self.ring = memoryview(self._mm)
        self._strtab_used = 0
        self._strings: dict[str, int] = {"": 0}
        self.lock = threading.Lock()
        self.closed = False

    # -- strings and notes (rare) ------------------------------------------------------------
    def intern(self, text: str) -> int:
        """Id of ``text`` in the string table; 0 (the empty string) when the table is full."""
        sid = self._strings.get(text)
        if sid is not None:
            return sid
        sid = len(self._strings)
        if not self._append(fmt.StrKind.STRING, sid, text.encode("utf-8", "replace")):
            return 0
        self._strings[text] = sid
        return sid

    def note(self, kind: str, *, share: float = 1.0, **fields: Any) -> bool:
        """Append a JSON note (lifecycle, group definition); never overwritten by the ring.
        ``share`` < 1 refuses the note once the table is that full, keeping the rest for the
        notes that matter more (silent-error notes use part of it, lifecycle notes all)."""
        fields["note"] = kind
        fields.setdefault("time_ns", time.time_ns())
        payload = json.dumps(fields, sort_keys=True, default=str).encode()
        return self._append(fmt.StrKind.NOTE, 0, payload, share)

    def _append(self, kind: int, sid: int, payload: bytes, share: float = 1.0) -> bool:
        with self.lock:
            return self._append_locked(kind, sid, payload, share)

    def _append_locked(self, kind: int, sid: int, payload: bytes, share: float) -> bool:
        if self.closed:
            return False
        need = fmt.STR_HEAD.size + len(payload) + fmt.CRC.size
        # keep room for a terminating zero length word
        if self._strtab_used + need + 4 > self.strtab_size * share:
            return False
        off = self.strtab_offset + self._strtab_used
        head = fmt.STR_HEAD.pack(len(payload), kind, sid)
        body = head[4:] + payload  # kind + id + payload, covered by the CRC
        self._mm[off : off + need] = head + payload + fmt.CRC.pack(fmt.crc32(body))
        self._strtab_used += need
        fmt.COUNTER.pack_into(self._mm, fmt.STRTAB_USED_OFFSET, self._strtab_used)
        return True

    # -- events (the recorder calls ``events`` directly on its hot path) ----------------------
    @property
    def count(self) -> int:
        """Index of the latest record started; record indices start at 1."""
        return self.events.count

    def begin(self, fields: tuple) -> int:
        """Write the enter part of a new record. ``fields`` are ENTER's fields after ``idx``."""
        return self.events.begin(*fields)

    def record(self, idx: int) -> tuple | None:
        """The ENTER fields of record ``idx`` as written, or None once the ring has lapped it."""
        if self.events.count - idx >= self.capacity:
            return None
        off = self.ring_offset + ((idx - 1) % self.capacity) * fmt.RECORD_SIZE
        return fmt.ENTER.unpack_from(self.ring, off)

    def end(self, idx: int, state: int, seq_delta: int) -> None:
        """Write the exit part of record ``idx`` unless the ring has lapped it since."""
        if not self.closed:
            self.events.end(idx, state, seq_delta)

    def close(self) -> None:
        """Stop writing. The mapping stays valid for other threads still holding a reference."""
        self.closed = True


