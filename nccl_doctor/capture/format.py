"""Layout of a per-rank capture file (format version 1).

One file per process that joined a process group. It is a fixed-size memory-mapped file, so the
recorder's hot path makes no system call, the data survive SIGKILL/SIGABRT of the rank (the pages
belong to the page cache, not to the process) and the supervisor can read them while the rank lives
or hangs. Its size is fixed when it is created, so a long job never grows it.

    header   HEADER_SIZE bytes: magic, version, geometry, two live counters, metadata JSON
    strings  an append-only table of interned strings and JSON notes (entries with a CRC)
    ring     ``capacity`` fixed-size event records; record i lives in slot i % capacity

An event record is written twice: the *enter* part (with an Adler-32 check) when a call starts,
and the 16-byte *exit* part when it returns, guarded by a check word derived from the record's
index so that an exit left over from a previous lap of the ring, or a torn write, is detected.
Records use Adler-32 rather than CRC32 because the check is computed on every collective and
zlib's CRC32 costs three times as much on 104 bytes; metadata and strings, written rarely, keep
CRC32.
"""

from __future__ import annotations

import enum
import struct
import zlib

# The numbers a record holds (nccl_doctor.model names them with the rest of the data model; they
# live here, with the layout, so that a rank reads them without importing the model)


class EventKind(enum.IntEnum):
    COLLECTIVE = 1  # all_reduce, all_gather, broadcast, barrier, ... (every member takes part)
    P2P = 2  # send / recv / isend / irecv (matched pairwise)
    WAIT = 3  # Work.wait() on an async op; ``parent`` is the op's record
    GROUP = 4  # new_group / split: creates a process group
    INIT = 5  # init_process_group
    DESTROY = 6  # destroy_process_group


class EventFlag(enum.IntFlag):
    NONE = 0
    ASYNC = 1  # called with async_op=True (or isend/irecv)
    COALESCED = 2  # a *_coalesced op, or issued inside a coalescing manager
    NONUNIFORM_LIST = 4  # a tensor list whose members differ in shape or dtype
    COMPOSITE = 8  # a wrapper around other recorded calls (object collectives, _base aliases)
    # issued through the functional collectives (torch.ops._c10d_functional: DTensor, tensor
    # parallel, funcol, compiled graphs), seen at the dispatcher (rank/recorder/functional.py)
    FUNCTIONAL = 16


class EventState(enum.IntEnum):
    ENTERED = 0  # no exit written: the call is still running, or the process died inside it
    RETURNED = 1  # returned normally (for NCCL: enqueued on the GPU, not necessarily complete)
    FAILED = 2  # raised an exception
    ISSUED = 3  # async op returned its Work; see the WAIT record for completion


#: A world size or rank above this, in a marker or a file's name, is not believed (they are input)
MAX_WORLD = 1 << 20

MAGIC = b"NCDOCCAP"
FORMAT_VERSION = 2
#: Versions this reader reads. Version 1 (before call paths) left field ``path`` 0 in every
#: record but a wait's, where it held the async op's name: a version-1 capture has no call paths.
READABLE_VERSIONS = (1, 2)
PATHS_SINCE = 2  # the first version whose records name their call path


def readable_versions() -> str:
    """``1 and 2``: the capture format versions this reader reads, in words."""
    *most, last = (str(v) for v in READABLE_VERSIONS)
    return f"{', '.join(most)} and {last}" if most else last
HEADER_SIZE = 4096
RECORD_SIZE = 128
DEFAULT_RING_RECORDS = 32768  # 4 MiB of events per rank
DEFAULT_STRTAB_BYTES = 1 << 20  # 1 MiB of interned strings and notes per rank
CAPTURE_SUFFIX = ".ndcap"
FAULT_SUFFIX = ".fault"  # the rank's faulthandler output, beside its capture file
UNRECORDED_SUFFIX = ".unrecorded"  # left instead of a capture its rank could not make

# magic, version, header size, record size, capacity, ring offset, strtab offset, strtab size, created
HEADER = struct.Struct("<8sIIIIQQQQ")
# u64: records started so far (the ring's ``count``): the supervisor's cheap progress counter,
# read while the rank runs (the ring rewrites it with each record: a plain store, no system call)
EVENTS_STARTED_OFFSET = 64
STRTAB_USED_OFFSET = 72  # u64: bytes of the string table in use
COUNTER = struct.Struct("<Q")
META_OFFSET = 256
META_HEAD = struct.Struct("<II")  # length, crc32 of the JSON that follows
META_MAX = HEADER_SIZE - META_OFFSET - META_HEAD.size

# Enter part of a record; the Adler-32 of these bytes follows them (record_check).
#   idx parent t_enter seq nbytes thread | op group in out | user file/line/func | api file/line |
#   path peer group_size seq_offset kind flags
# (path: the string id of the call's path, rank/recorder/arguments.path_text: the frames outside
# torch from the API caller out to the user's, innermost first)
ENTER = struct.Struct("<QQQqQQIIIIIIIIIIiiIBBH")
CRC = struct.Struct("<I")
EXIT_OFFSET = ENTER.size + CRC.size + 4  # 112
# Everything after the enter part, written with it: its check, padding, and a blank exit part.
TAIL = struct.Struct("<I4xQhHI")
# Exit part: t_exit, seq delta (PyTorch's group sequence number after minus before), state, check
EXIT = struct.Struct("<QhHI")
assert EXIT_OFFSET + EXIT.size == RECORD_SIZE
assert ENTER.size + TAIL.size == RECORD_SIZE

# String table entry: payload length, kind, id; then the payload and the CRC32 of kind+id+payload.
STR_HEAD = struct.Struct("<IBxxxI")


class StrKind(enum.IntEnum):
    STRING = 1  # an interned string, referenced by id from records
    NOTE = 2  # a JSON object: lifecycle (exit, exception), group definitions


def exit_check(idx: int, t_exit: int, seq_delta: int, state: int) -> int:
    """Check word binding an exit part to its record (cheap: no CRC on the exit path)."""
    return (idx * 0x9E3779B1 ^ t_exit ^ (state << 20) ^ (seq_delta & 0xFFFF)) & 0xFFFFFFFF


def record_check(enter: bytes) -> int:
    """Check of a record's enter part (Adler-32: never 0, so a blank slot never passes)."""
    return zlib.adler32(enter)


def crc32(data: bytes) -> int:
    return zlib.crc32(data) & 0xFFFFFFFF
