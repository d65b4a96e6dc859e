"""The event ring: writes records into the capture's mapping (the recorder's hot path).

Two implementations with one interface and byte-identical output: ``PyRing`` here, and ``Ring``
from the optional C extension ``nccl_doctor.capture._ring``, built when a C compiler is present at
install time. The C one is used when it imported; ``NCCL_DOCTOR_PURE_PYTHON=1`` forces Python.

    begin(parent, t_enter, seq, nbytes, thread, op, group, inp, out, ufile, uline, ufunc, afile,
          aline, extra, peer, group_size, seq_offset, kind, flags, pad) -> idx
        writes the enter part of the next record (t_enter 0: now) with its Adler-32 check and a
        blank exit part; indices start at 1 and the record lives in slot (idx - 1) % capacity.
    end(idx, state, seq_delta[, t_exit]) -> None
        writes record idx's exit part (t_exit 0 or absent: now), unless the ring lapped it.
    count, capacity
        ``count`` is also stored (u64) at ``counter_offset`` of the buffer when one is given.

The C extension also holds the recorder's fast path (``fast_path``): it writes a call's records
straight into a C ring from the recorder's caches; the recorder's Python path is its fallback.
"""

from __future__ import annotations

import itertools
import os
import time
from typing import Any

from nccl_doctor.capture import format as fmt

PURE_PYTHON_ENV = "NCCL_DOCTOR_PURE_PYTHON"

try:
    from nccl_doctor.capture import _ring as _c
except ImportError:  # built without a C compiler: the Python ring does the same, slower
    _c = None
_CRing = getattr(_c, "Ring", None)
# The recorder's fast path (see Recording, Call and Recorded in _ring.c); absent from an older
# build, which then records through the Python path.
_CFast = tuple(getattr(_c, name, None) for name in ("Recording", "Call", "Recorded"))


class PyRing:
    __slots__ = ("_buf", "_offset", "_next", "_counter", "capacity", "count")

    def __init__(self, buffer: Any, offset: int, capacity: int, counter_offset: int = -1) -> None:
        view = memoryview(buffer)
        if capacity < 1 or offset < 0 or len(view) < offset + capacity * fmt.RECORD_SIZE:
            raise ValueError("the ring does not fit in the buffer")
        if counter_offset + 8 > len(view):
            raise ValueError("the counter does not fit in the buffer")
        self._counter = counter_offset
        self._buf, self._offset, self.capacity, self.count = view, offset, capacity, 0
        self._next = itertools.count(1).__next__  # atomic under the GIL: threads get unique indices

    def begin(self, parent: int, t_enter: int, *fields: int) -> int:
        idx = self._next()
        raw = _pack(idx, parent, t_enter or time.time_ns(), *fields)  # raises if out of range
        self.count = idx  # another thread may be a record ahead: ``count`` only bounds lapping
        off = self._offset + ((idx - 1) % self.capacity) * _RECORD
        self._buf[off : off + _ENTER_SIZE] = raw
        _tail_pack(self._buf, off + _ENTER_SIZE, fmt.record_check(raw), 0, 0, 0, 0)
        if self._counter >= 0:
            _counter_pack(self._buf, self._counter, idx)
        return idx

    def end(self, idx: int, state: int, seq_delta: int, t_exit: int = 0) -> None:
        if idx < 1 or self.count - idx >= self.capacity:
            return
        t_exit = t_exit or time.time_ns()
        _exit_pack(
            self._buf, self._offset + ((idx - 1) % self.capacity) * _RECORD + fmt.EXIT_OFFSET,
            t_exit, seq_delta, state, fmt.exit_check(idx, t_exit, seq_delta, state),
        )


def accelerated() -> bool:
    """Whether new rings are the C implementation."""
    return _CRing is not None and os.environ.get(PURE_PYTHON_ENV, "") in ("", "0")


def is_c_ring(ring: Any) -> bool:
    """Whether ``ring`` is the C implementation (the recorder's C fast path writes only to it)."""
    return _CRing is not None and type(ring) is _CRing


def fast_path() -> tuple[type, type, type] | None:
    """The C types of the recorder's fast path, ``(Recording, Call, Recorded)``, when new rings
    are C ones. A ``Recorded`` replaces a torch.distributed function: it writes, from the
    recorder's caches, the records the recorder's Python path (nccl_doctor/rank/recorder/
    wrappers.py) would, around the real call, and leaves to that path what they do not cover.
    """
    if accelerated() and all(t is not None for t in _CFast):
        return _CFast  # type: ignore[return-value]
    return None


def make_ring(buffer: Any, offset: int, capacity: int, counter_offset: int = -1) -> Any:
    """A ring over ``buffer`` (writable), in C when available."""
    if accelerated():
        return _CRing(buffer, offset, capacity, counter_offset)
    return PyRing(buffer, offset, capacity, counter_offset)


_RECORD = fmt.RECORD_SIZE
_ENTER_SIZE = fmt.ENTER.size
_pack = fmt.ENTER.pack
_tail_pack = fmt.TAIL.pack_into
_exit_pack = fmt.EXIT.pack_into
_counter_pack = fmt.COUNTER.pack_into
