"""Capture files written by the real ``CaptureWriter`` and read back by the real reader."""

from __future__ import annotations

import errno
import json
import mmap
import os
import resource
import struct
from pathlib import Path

import pytest

from nccl_doctor.analysis import analyze
from nccl_doctor.capture import format as fmt
from nccl_doctor.analysis.calls.loaded import load_capture_dir
from nccl_doctor.capture.manifest import MANIFEST, MANIFEST_FORMAT, Manifest, read_manifest
from nccl_doctor.capture.names import remove_own_files
from nccl_doctor.capture.follow import read_capture
from nccl_doctor.capture.reader import parse_fault
from nccl_doctor.capture.unrecorded import MAX_BYTES, UNKNOWN, write_unrecorded
from nccl_doctor.capture.writer import CaptureWriter
from nccl_doctor.errors import (
    CaptureNotFound, CorruptCapture, DoctorError, ExitStatus, NotACapture, UnsupportedVersion,
)
from nccl_doctor.model import (
    Location, EventFlag, EventKind, EventState, ExitKind, GroupInfo, Integrity, Unrecorded,
)

T0 = 1_700_000_000_000_000_000

FAULT_TEXT = (
    "Fatal Python error: Aborted\n"
    "\n"
    "Current thread 0x00007f3b2c4e5740 (most recent call first):\n"
    '  File "/x/train.py", line 12 in main\n'
    '  File "/x/train.py", line 30 in <module>\n'
)


# -- helpers -------------------------------------------------------------------------------------

def meta_for(rank: int, **extra) -> dict:
    meta = {
        "rank": rank, "world_size": 2, "host": "node0", "pid": 4000 + rank, "local_rank": rank,
        "node_rank": 0, "started_ns": T0 + rank, "run_id": "run-42",
        "argv": ["train.py", "--lr", "0.1"], "versions": {"torch": "2.4.0"},
        "env": {"MASTER_PORT": "29500"},
    }
    meta.update(extra)
    return meta


def new_writer(directory: Path, rank: int = 0, *, name: str | None = None, **kw) -> CaptureWriter:
    meta = kw.pop("meta", None) or meta_for(rank)
    path = directory / (name or f"rank{rank:05d}.node0.{4000 + rank}{fmt.CAPTURE_SUFFIX}")
    return CaptureWriter(path, meta, **kw)


def enter_fields(w: CaptureWriter, *, seq: int, op: str = "all_reduce", group: str = "0",
                 inp: str = "float32[4]", parent: int = 0, kind: EventKind = EventKind.COLLECTIVE,
                 flags: int = 0, peer: int = -1, group_size: int = 2, seq_offset: int = 0,
                 t_enter: int | None = None) -> tuple:
    """ENTER's fields after idx, for a typical call made from /job/train.py."""
    return (
        parent, t_enter if t_enter is not None else T0 + seq * 1000, seq, 16, 77,
        w.intern(op), w.intern(group), w.intern(inp), 0,
        w.intern("/job/train.py"), 10 + seq, w.intern("step"), w.intern("/job/train.py"), 10 + seq,
        0, peer, group_size, seq_offset, int(kind), flags, 0,
    )


def write_calls(w: CaptureWriter, n: int, *, finish_last: bool = True, **kw) -> list[int]:
    """``n`` collectives seq 1..n; every one returns except possibly the last."""
    idxs = []
    for seq in range(1, n + 1):
        idx = w.begin(enter_fields(w, seq=seq, **kw))
        if seq < n or finish_last:
            w.end(idx, int(EventState.RETURNED), 1)
        idxs.append(idx)
    return idxs


def record_offset(w: CaptureWriter, idx: int) -> int:
    return w.ring_offset + ((idx - 1) % w.capacity) * fmt.RECORD_SIZE


def patch_file(path: Path, offset: int, data: bytes) -> None:
    with open(path, "r+b") as fh:
        fh.seek(offset)
        fh.write(data)


def flip_byte(path: Path, offset: int) -> None:
    with open(path, "r+b") as fh:
        fh.seek(offset)
        b = fh.read(1)
        fh.seek(offset)
        fh.write(bytes([b[0] ^ 0xFF]))


# -- round trip ----------------------------------------------------------------------------------

def test_round_trip_every_event_field(tmp_path: Path) -> None:
    w = new_writer(tmp_path)
    op, grp = w.intern("broadcast"), w.intern("0")
    inp, out = w.intern("4*float32[2,7,32]"), w.intern("float32[8,7,32]")
    uf, ufn = w.intern("/job/train.py"), w.intern("train_step")
    af = w.intern("/venv/lib/accelerate/utils.py")
    path = w.intern(f"{af}:99:0 {uf}:42:{ufn}")  # the call path: accelerate, then the user
    assert w.intern("broadcast") == op  # interning is idempotent
    assert len({op, grp, inp, out, uf, ufn, af, path}) == 8 and 0 not in {op, grp, inp, uf}

    fields = (0, T0 + 5, 7, 4096, 123456789, op, grp, inp, out, uf, 42, ufn, af, 99, path,
              3, 4, 2, int(EventKind.COLLECTIVE), int(EventFlag.ASYNC | EventFlag.COALESCED), 0)
    idx = w.begin(fields)
    assert idx == 1 and w.count == 1
    w.end(idx, int(EventState.ISSUED), 1)
    # a second record: a WAIT whose parent is the first, raising, and with no callsite at all
    wait_op = w.intern("wait")
    idx2 = w.begin((idx, T0 + 9, -1, 0, 5, wait_op, grp, 0, 0, 0, 0, 0, 0, 0, 0, -1, 4, 0,
                    int(EventKind.WAIT), 0, 0))
    w.end(idx2, int(EventState.FAILED), -2)
    assert w.record(idx) == (idx,) + fields

    trace = read_capture(w.path)
    assert trace.integrity == Integrity()
    assert trace.integrity.complete
    assert [e.idx for e in trace.events] == [1, 2]
    e = trace.events[0]
    assert e.parent == 0
    assert e.kind is EventKind.COLLECTIVE
    assert e.op == "broadcast" and e.group == "0"
    assert e.seq == 7 and e.seq_offset == 2 and e.align_seq == 5
    assert e.seq_delta == 1
    assert e.state is EventState.ISSUED
    assert e.flags == EventFlag.ASYNC | EventFlag.COALESCED
    assert e.t_enter_ns == T0 + 5
    assert e.t_exit_ns is not None and e.t_exit_ns > 0
    assert e.thread == 123456789
    assert e.input == "4*float32[2,7,32]" and e.output == "float32[8,7,32]"
    assert e.nbytes == 4096
    assert e.peer == 3 and e.group_size == 4
    assert e.callsite == Location("/job/train.py", 42, "train_step")
    assert e.api_callsite == Location("/venv/lib/accelerate/utils.py", 99, "")
    assert e.path == (Location("/venv/lib/accelerate/utils.py", 99, ""),
                      Location("/job/train.py", 42, "train_step"))
    assert trace.paths_recorded
    assert e.done and not e.is_composite

    e2 = trace.events[1]
    assert e2.parent == 1 and e2.kind is EventKind.WAIT and e2.op == "wait"
    assert e2.seq == -1 and e2.align_seq == -1
    assert e2.seq_delta == -2 and e2.state is EventState.FAILED
    assert e2.peer == -1 and e2.input == "" and e2.output == ""
    assert e2.callsite is None and e2.api_callsite is None and e2.where == "?"
    assert e2.path == ()


def test_round_trip_meta(tmp_path: Path) -> None:
    w = new_writer(tmp_path, rank=1)
    trace = read_capture(w.path)
    m = trace.meta
    assert trace.rank == 1 and m.rank == 1
    assert m.world_size == 2 and m.local_rank == 1 and m.node_rank == 0
    assert m.host == "node0" and m.pid == 4001 and m.started_ns == T0 + 1
    assert m.run_id == "run-42"
    assert m.argv == ("train.py", "--lr", "0.1")
    assert dict(m.versions) == {"torch": "2.4.0"} and dict(m.env) == {"MASTER_PORT": "29500"}
    assert trace.path == str(w.path)
    assert trace.events == () and trace.last_event() is None


def test_round_trip_notes_and_exit_kinds(tmp_path: Path) -> None:
    a = new_writer(tmp_path, 0)
    write_calls(a, 3)
    assert a.note("group", name="0", ranks=[0, 1], backend="gloo", desc="default_pg")
    assert a.note("group", name="1", ranks=[1], backend="gloo", desc="")
    assert a.note("exit", time_ns=T0 + 77)

    b = new_writer(tmp_path, 1)
    write_calls(b, 3)
    b.note("group", name="0", ranks=[0, 1], backend="gloo", desc="default_pg")
    b.note("exception", type="ValueError", message="bad batch", path="/job/train.py", line=40,
           function="step", time_ns=T0 + 88)
    b.note("exit")  # atexit still runs after an uncaught exception: the exception wins

    ta, tb_ = read_capture(a.path), read_capture(b.path)
    assert ta.exit.kind is ExitKind.CLEAN and ta.exit.code == 0 and ta.exit.time_ns == T0 + 77
    assert not ta.exit.abnormal
    assert [n["note"] for n in ta.notes] == ["group", "group", "exit"]
    assert ta.notes[0]["ranks"] == [0, 1] and ta.notes[0]["backend"] == "gloo"

    assert tb_.exit.kind is ExitKind.EXCEPTION and tb_.exit.abnormal
    assert tb_.exit.code == 1
    assert tb_.exit.exception == "ValueError: bad batch"
    assert tb_.exit.callsite == Location("/job/train.py", 40, "step")
    assert tb_.exit.time_ns == T0 + 88

    ts = load_capture_dir(tmp_path)
    assert sorted(ts.ranks) == [0, 1] and ts.world_size == 2
    assert ts.groups == {
        "0": GroupInfo("0", (0, 1), "gloo", "default_pg"),
        "1": GroupInfo("1", (1,), "gloo", ""),
    }
    assert ts.problems == ()
    assert len(ts.ranks[0].events) == 3


def test_exception_note_without_location_has_no_callsite(tmp_path: Path) -> None:
    w = new_writer(tmp_path)
    w.note("exception", type="KeyError", message="'x'")
    ex = read_capture(w.path).exit
    assert ex.kind is ExitKind.EXCEPTION and ex.callsite is None
    assert ex.exception == "KeyError: 'x'"


def test_sys_exit_code_is_kept(tmp_path: Path) -> None:
    w = new_writer(tmp_path)
    w.note("sys_exit", code=3)
    w.note("exit")
    ex = read_capture(w.path).exit
    assert ex.kind is ExitKind.CLEAN and ex.code == 3 and ex.abnormal


def test_no_exit_note_is_running(tmp_path: Path) -> None:
    w = new_writer(tmp_path)
    write_calls(w, 2)
    w.note("group", name="0", ranks=[0, 1])
    assert read_capture(w.path).exit.kind is ExitKind.RUNNING


def test_entered_record_reads_as_entered(tmp_path: Path) -> None:
    w = new_writer(tmp_path)
    write_calls(w, 3, finish_last=False)
    trace = read_capture(w.path)
    assert [e.state for e in trace.events] == [
        EventState.RETURNED, EventState.RETURNED, EventState.ENTERED,
    ]
    last = trace.events[-1]
    assert last.t_exit_ns is None and last.seq_delta is None and not last.done
    assert trace.integrity.complete and trace.integrity.torn_records == 0


# -- ring ----------------------------------------------------------------------------------------

def test_ring_wrap_keeps_the_newest_records(tmp_path: Path) -> None:
    w = new_writer(tmp_path, capacity=16)
    write_calls(w, 40)
    trace = read_capture(w.path)
    assert [e.idx for e in trace.events] == list(range(25, 41))
    assert [e.seq for e in trace.events] == list(range(25, 41))
    assert all(e.state is EventState.RETURNED for e in trace.events)
    assert trace.integrity.overwritten == 24
    assert trace.integrity.torn_records == 0
    assert trace.integrity.complete  # losing the oldest records to the ring is not damage
    assert "24 oldest event(s) overwritten" in trace.integrity.describe()


def test_exit_of_a_lapped_record_is_not_written(tmp_path: Path) -> None:
    w = new_writer(tmp_path, capacity=16)
    write_calls(w, 20, finish_last=False)  # idx 20 (slot 3) still running
    first_idx = 4  # lives in slot 3 too, lapped by idx 20
    assert w.record(first_idx) is None
    assert w.record(20) is not None and w.record(20)[0] == 20
    w.end(first_idx, int(EventState.RETURNED), 1)  # must not land on record 20
    trace = read_capture(w.path)
    assert trace.events[-1].idx == 20 and trace.events[-1].state is EventState.ENTERED
    assert trace.integrity.torn_records == 0


def test_writer_refuses_a_tiny_ring_big_metadata_and_an_existing_file(tmp_path: Path) -> None:
    with pytest.raises(ValueError):
        new_writer(tmp_path, capacity=15)
    with pytest.raises(ValueError):
        new_writer(tmp_path, meta=meta_for(0, blob="x" * fmt.META_MAX))
    w = new_writer(tmp_path)
    with pytest.raises(FileExistsError):
        new_writer(tmp_path)
    w.close()
    assert w.note("exit") is False  # a closed writer writes nothing
    assert read_capture(w.path).exit.kind is ExitKind.RUNNING


def test_file_size_is_fixed_by_geometry(tmp_path: Path) -> None:
    w = new_writer(tmp_path, capacity=32, strtab_bytes=8192)
    assert w.path.stat().st_size == fmt.HEADER_SIZE + 8192 + 32 * fmt.RECORD_SIZE
    write_calls(w, 100)
    assert w.path.stat().st_size == fmt.HEADER_SIZE + 8192 + 32 * fmt.RECORD_SIZE


def minor_faults() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt


def test_a_preallocated_capture_takes_its_blocks_and_pages_at_creation(tmp_path: Path) -> None:
    """The recorder's captures (preallocate=True): writing the whole ring afterwards takes no
    page fault - each one cost ~25 us of the user's collective call on ext4 - while a sparse
    capture faults once per page of the ring."""
    geometry = {"capacity": 4096, "strtab_bytes": 1 << 16}  # a 512 KiB ring: 128 pages
    sparse = new_writer(tmp_path, 0, **geometry)
    full = new_writer(tmp_path, 1, preallocate=True, **geometry)
    size = full.path.stat().st_size
    assert full.path.stat().st_blocks * 512 >= size > sparse.path.stat().st_blocks * 512
    pages = geometry["capacity"] * fmt.RECORD_SIZE // mmap.PAGESIZE
    faults = {}
    for name, w in (("sparse", sparse), ("full", full)):
        enter_fields(w, seq=1)  # its strings interned before counting
        before = minor_faults()
        write_calls(w, geometry["capacity"])
        faults[name] = minor_faults() - before
    assert faults["sparse"] >= pages // 2 and faults["full"] < pages // 4, faults
    for w in (sparse, full):  # the same capture either way
        w.note("exit")
        trace = read_capture(w.path)
        assert [e.seq for e in trace.events] == list(range(1, geometry["capacity"] + 1))
        assert trace.integrity.torn_records == 0


def test_no_room_for_a_preallocated_capture_fails_at_creation(tmp_path: Path, monkeypatch,
                                                              full_disk) -> None:
    """A full disk is an OSError when the capture is made (no file left behind), not a SIGBUS
    in a collective call later; a file system that cannot reserve blocks keeps it sparse (its
    pages are not written ahead either: on a full disk that write would be the SIGBUS)."""
    with pytest.raises(OSError) as err:
        new_writer(tmp_path, preallocate=True)
    assert err.value.errno == errno.ENOSPC
    assert list(tmp_path.iterdir()) == []

    def unsupported(fd: int, offset: int, length: int) -> None:
        raise OSError(errno.EOPNOTSUPP, os.strerror(errno.EOPNOTSUPP))

    monkeypatch.setattr(os, "posix_fallocate", unsupported)
    w = new_writer(tmp_path, preallocate=True)
    assert w.path.stat().st_blocks * 512 < w.path.stat().st_size // 2  # untouched: sparse
    write_calls(w, 3)
    w.note("exit")
    assert [e.seq for e in read_capture(w.path).events] == [1, 2, 3]


def test_a_rank_that_could_not_make_its_capture_is_unrecorded_not_absent(tmp_path: Path) -> None:
    w = new_writer(tmp_path, 0)
    write_calls(w, 3)
    w.note("exit")
    why = "cannot create its capture in /out (No space left on device)"
    assert write_unrecorded(tmp_path, "rank00001.node0.4001", 1, 3, "node0", why) is not None
    assert write_unrecorded(tmp_path, "rank00001.node0.4001", 1, 3, "node0", why) is None  # once
    write_unrecorded(tmp_path, "rank00000.node0.4000", 0, 3, "node0", "stale")  # has a capture
    ts = load_capture_dir(tmp_path, job_ended=True)
    assert set(ts.ranks) == {0} and ts.unrecorded == {1: Unrecorded(why, "node0")}
    assert ts.world_size == 3
    assert not ts.problems


@pytest.mark.parametrize("content", [
    b"", b"\x00garbage", b'{"rank": tr', b'{"rank": true}', b'{"rank": 2, "why": "not mine"}',
    b"[1]", b"[" * 5000, b'{"rank": 1, "why": "' + b"x" * MAX_BYTES + b'"}',
    b'{"rank": 1, "world_size": 1000000000, "why": "cannot create its capture"}'])
def test_an_empty_or_damaged_marker_still_names_its_rank(tmp_path: Path, content: bytes) -> None:
    """On a full disk a marker's name is made but its body may not be written, or only in part:
    the name says the rank. A body's world size beyond belief is not believed."""
    w = new_writer(tmp_path, 0, meta=meta_for(0, world_size=2))
    write_calls(w, 2)
    w.note("exit")
    (tmp_path / f"rank00001.node0.4001{fmt.UNRECORDED_SUFFIX}").write_bytes(content)
    ts = load_capture_dir(tmp_path, job_ended=True)
    why = "cannot create its capture" if b"world_size" in content else UNKNOWN
    assert ts.unrecorded == {1: Unrecorded(why)} and set(ts.ranks) == {0} and ts.world_size == 2
    assert not ts.problems


def test_what_is_not_a_marker_is_a_note_and_never_opened(tmp_path: Path) -> None:
    w = new_writer(tmp_path, 0)
    write_calls(w, 2)
    w.note("exit")
    (tmp_path / f"notes{fmt.UNRECORDED_SUFFIX}").write_text("{}")
    (tmp_path / f"rank00001.node0.4001{fmt.UNRECORDED_SUFFIX}").mkdir()
    os.mkfifo(tmp_path / f"rank00002.node0.4002{fmt.UNRECORDED_SUFFIX}")  # open() would block
    ts = load_capture_dir(tmp_path, job_ended=True)
    assert ts.unrecorded == {} and set(ts.ranks) == {0}
    assert sorted(ts.problems) == sorted(
        f"{name}{fmt.UNRECORDED_SUFFIX} skipped: not an nccl-doctor marker of an unrecorded rank"
        for name in ("notes", "rank00001.node0.4001", "rank00002.node0.4002"))
    remove_own_files(tmp_path)  # a directory of a name it owns is left alone, not an error
    assert [p.name for p in tmp_path.iterdir()] == [f"rank00001.node0.4001{fmt.UNRECORDED_SUFFIX}"]


# -- damage --------------------------------------------------------------------------------------

def test_torn_enter_part(tmp_path: Path) -> None:
    w = new_writer(tmp_path, 0)
    write_calls(w, 5)
    w.note("exit")
    flip_byte(w.path, record_offset(w, 3) + 20)  # inside record 3's t_enter
    trace = read_capture(w.path)
    assert trace.integrity.torn_records == 1
    assert not trace.integrity.complete
    assert [e.idx for e in trace.events] == [1, 2, 4, 5]
    assert all(e.state is EventState.RETURNED and e.op == "all_reduce" for e in trace.events)
    assert [e.seq for e in trace.events] == [1, 2, 4, 5]

    b = new_writer(tmp_path, 1)
    write_calls(b, 5)
    ts = load_capture_dir(tmp_path)
    assert sorted(ts.ranks) == [0, 1]
    # a record torn in a rank that exited by itself: no kill cut it, so the file is damaged
    damaged = [p for p in ts.problems if "damaged" in p]
    assert damaged == [f"rank 0's capture {w.path.name} is damaged (1 torn record(s)): what it "
                       "still held was used, what it lost is not evidence against rank 0; the "
                       "diagnosis is partial"]
    assert ts.damaged_ranks() == {0}


def test_torn_exit_part(tmp_path: Path) -> None:
    w = new_writer(tmp_path)
    write_calls(w, 4)
    check_at = record_offset(w, 2) + fmt.EXIT_OFFSET + 12  # the exit's check word
    flip_byte(w.path, check_at)
    trace = read_capture(w.path)
    assert [e.idx for e in trace.events] == [1, 2, 3, 4]
    assert trace.events[1].state is EventState.ENTERED and trace.events[1].t_exit_ns is None
    assert [e.state for e in trace.events[::2]] == [EventState.RETURNED] * 2
    assert trace.integrity.torn_records == 1 and not trace.integrity.complete


def test_record_in_the_wrong_slot_is_rejected(tmp_path: Path) -> None:
    """A record whose idx does not belong in its slot (a stale copy) is not trusted."""
    w = new_writer(tmp_path)
    write_calls(w, 3)
    raw = w.path.read_bytes()
    rec2 = raw[record_offset(w, 2): record_offset(w, 2) + fmt.RECORD_SIZE]
    patch_file(w.path, record_offset(w, 3), rec2)  # slot 2 now holds a valid copy of idx 2
    trace = read_capture(w.path)
    assert [e.idx for e in trace.events] == [1, 2]
    assert trace.integrity.torn_records == 1


def test_truncated_in_the_ring(tmp_path: Path) -> None:
    w = new_writer(tmp_path, capacity=32)
    write_calls(w, 20)
    w.note("exit")
    cut = record_offset(w, 11) + 50  # in the middle of record 11
    os.truncate(w.path, cut)
    trace = read_capture(w.path)
    assert trace.integrity.truncated and not trace.integrity.complete
    full = w.ring_offset + w.capacity * fmt.RECORD_SIZE  # what the header says
    said = f"truncated at {cut:,} of {full:,} bytes"
    assert trace.integrity.describe() == said
    assert [e.idx for e in trace.events] == list(range(1, 11))
    assert trace.exit.kind is ExitKind.CLEAN  # notes live before the ring: intact
    ts = load_capture_dir(tmp_path)
    # a damaged capture: said once, with what was used, and the diagnosis partial
    name = Path(trace.path).name
    assert [p for p in ts.problems if said in p] == [
        f"rank 0's capture {name} is damaged ({said}): what it still held was used, what it "
        "lost is not evidence against rank 0; the diagnosis is partial"]
    assert ts.damaged_ranks() == {0}


def test_truncated_in_the_string_table(tmp_path: Path) -> None:
    w = new_writer(tmp_path)
    w.note("group", name="0", ranks=[0, 1])
    w.note("exit", padding="p" * 200)
    used = struct.unpack_from("<Q", w.path.read_bytes(), fmt.STRTAB_USED_OFFSET)[0]
    os.truncate(w.path, fmt.HEADER_SIZE + used - 20)  # inside the exit note
    trace = read_capture(w.path)
    assert trace.integrity.truncated
    assert trace.integrity.bad_strings == 1
    assert [n["note"] for n in trace.notes] == ["group"]
    assert trace.exit.kind is ExitKind.RUNNING


def test_corrupt_string_entry(tmp_path: Path) -> None:
    w = new_writer(tmp_path)
    write_calls(w, 2)
    used = struct.unpack_from("<Q", w.path.read_bytes(), fmt.STRTAB_USED_OFFSET)[0]
    w.note("exit")
    flip_byte(w.path, fmt.HEADER_SIZE + used + fmt.STR_HEAD.size + 2)  # inside the exit note
    trace = read_capture(w.path)
    assert trace.integrity.bad_strings == 1 and not trace.integrity.complete
    assert trace.exit.kind is ExitKind.RUNNING
    assert [e.op for e in trace.events] == ["all_reduce", "all_reduce"]


@pytest.mark.parametrize("cut", [32, 60, 300, fmt.HEADER_SIZE - 1])
def test_truncated_inside_the_header_is_corrupt(tmp_path: Path, cut: int) -> None:
    w = new_writer(tmp_path)
    write_calls(w, 2)
    os.truncate(w.path, cut)
    with pytest.raises(CorruptCapture) as err:
        read_capture(w.path)
    assert str(w.path) in str(err.value)
    assert err.value.exit_status == ExitStatus.CORRUPT


def test_corrupt_metadata_crc(tmp_path: Path) -> None:
    w = new_writer(tmp_path)
    flip_byte(w.path, fmt.META_OFFSET + fmt.META_HEAD.size + 3)
    with pytest.raises(CorruptCapture, match="metadata"):
        read_capture(w.path)


def test_metadata_without_rank_is_corrupt(tmp_path: Path) -> None:
    w = new_writer(tmp_path, meta={"world_size": 2})
    with pytest.raises(CorruptCapture, match="rank"):
        read_capture(w.path)


def test_damaged_geometry_is_corrupt(tmp_path: Path) -> None:
    w = new_writer(tmp_path)
    patch_file(w.path, 16, struct.pack("<I", 100))  # record size
    with pytest.raises(CorruptCapture):
        read_capture(w.path)


@pytest.mark.parametrize(
    "content",
    [
        bytes(range(256)) * 40,  # random-looking bytes
        b"epoch 1: loss 0.3\nepoch 2: loss 0.2\n" * 200,  # a log file renamed .ndcap
        b"",
    ],
    ids=["binary", "text", "empty"],
)
def test_foreign_file_is_not_a_capture(tmp_path: Path, content: bytes) -> None:
    path = tmp_path / "rank00000.node0.1.ndcap"
    path.write_bytes(content)
    with pytest.raises(NotACapture) as err:
        read_capture(path)
    assert err.value.exit_status == ExitStatus.NOT_A_CAPTURE
    with pytest.raises(NotACapture):  # the directory loader passes the one error on
        load_capture_dir(tmp_path)
    with pytest.raises(NotACapture):
        load_capture_dir(path)


@pytest.mark.parametrize("version", [0, 3, 99])
def test_wrong_format_version(tmp_path: Path, version: int) -> None:
    w = new_writer(tmp_path)
    write_calls(w, 2)
    patch_file(w.path, 8, struct.pack("<I", version))
    with pytest.raises(UnsupportedVersion) as err:
        read_capture(w.path)
    assert f"version {version}" in str(err.value)
    assert err.value.exit_status == ExitStatus.UNSUPPORTED_VERSION


def test_format_1_capture_reads_without_call_paths(tmp_path: Path) -> None:
    """A capture of format 1 (before call paths) still replays: its records' field 15 held
    something else then (a wait's async op), so no path is made of it, and the trace says so."""
    w = new_writer(tmp_path)
    op, user = w.intern("wait"), w.intern("/job/train.py")
    w.begin((0, T0, 1, 0, 1, op, w.intern("0"), 0, 0, user, 7, 0, 0, 0, op, -1, 2, 0,
             int(EventKind.WAIT), 0, 0))
    patch_file(w.path, 8, struct.pack("<I", 1))
    trace = read_capture(w.path)
    assert not trace.paths_recorded
    (e,) = trace.events
    assert e.path == () and e.callsite == Location("/job/train.py", 7, "")


def test_string_table_full(tmp_path: Path) -> None:
    w = new_writer(tmp_path, strtab_bytes=128)
    op = w.intern("all_reduce")
    assert op != 0
    assert w.intern("x" * 200) == 0  # does not fit
    assert w.intern("x" * 200) == 0  # still does not, still no error
    assert w.note("exit", padding="y" * 200) is False
    idx = w.begin(enter_fields(w, seq=1, op="all_reduce", group="a-group-name-too-long" * 5))
    w.end(idx, int(EventState.RETURNED), 1)
    trace = read_capture(w.path)
    assert trace.integrity.complete
    (e,) = trace.events
    assert e.op == "all_reduce" and e.state is EventState.RETURNED
    assert trace.exit.kind is ExitKind.RUNNING


# -- directory -----------------------------------------------------------------------------------

def test_missing_path(tmp_path: Path) -> None:
    with pytest.raises(CaptureNotFound) as err:
        load_capture_dir(tmp_path / "nope")
    assert err.value.exit_status == ExitStatus.NOT_FOUND


def test_empty_directory(tmp_path: Path) -> None:
    with pytest.raises(CaptureNotFound):
        load_capture_dir(tmp_path)


def test_directory_of_unrelated_files(tmp_path: Path) -> None:
    (tmp_path / "notes.txt").write_text("hello")
    (tmp_path / "model.pt").write_bytes(b"\x80\x02")
    with pytest.raises(NotACapture):
        load_capture_dir(tmp_path)


def test_single_file_with_another_suffix(tmp_path: Path) -> None:
    w = new_writer(tmp_path)
    other = tmp_path / "capture.bin"
    other.write_bytes(w.path.read_bytes())
    with pytest.raises(NotACapture):
        load_capture_dir(other)
    ts = load_capture_dir(w.path)  # the .ndcap itself loads
    assert list(ts.ranks) == [0]


def _manifest(directory: Path, **fields) -> None:
    raw = {"format": MANIFEST_FORMAT, "format_version": fmt.FORMAT_VERSION, "command": ["x"],
           "started_at": 1.0, "run_id": "r"}
    raw.update(fields)
    (directory / MANIFEST).write_text(json.dumps(raw))


def test_manifest_with_wrong_format(tmp_path: Path) -> None:
    new_writer(tmp_path)
    _manifest(tmp_path, format="something-else")
    with pytest.raises(NotACapture):
        load_capture_dir(tmp_path)


def test_manifest_with_future_version(tmp_path: Path) -> None:
    new_writer(tmp_path)
    _manifest(tmp_path, format_version=99)
    with pytest.raises(UnsupportedVersion, match="99"):
        load_capture_dir(tmp_path)


def test_manifest_invalid_json(tmp_path: Path) -> None:
    (tmp_path / MANIFEST).write_text('{"format": "nccl-doctor-capture", ')
    with pytest.raises(CorruptCapture, match="damaged"):  # and nothing else to read
        load_capture_dir(tmp_path)
    w = new_writer(tmp_path)
    write_calls(w, 2, finish_last=False)
    ts = load_capture_dir(tmp_path)  # the capture beside it is read: as if it had no manifest
    assert list(ts.ranks) == [0] and ts.command == () and ts.exit_status is None
    assert ts.ranks[0].exit.kind is ExitKind.RUNNING  # no end time: the job may still run
    assert any(p.startswith(f"{MANIFEST} is damaged (invalid JSON at line 1 column 35")
               for p in ts.problems)


def test_manifest_round_trip_and_fields_used(tmp_path: Path) -> None:
    m = Manifest(command=("torchrun", "train.py"), started_at=12.5, run_id="abc", ended_at=20.0,
                 exit_status=1, world_size=4, hosts=("node0",), captures=("a.ndcap",),
                 extra={"k": "v"})
    m.write(tmp_path)
    assert read_manifest(tmp_path) == m
    w = new_writer(tmp_path, 0)
    write_calls(w, 1)
    ts = load_capture_dir(tmp_path)
    assert ts.command == ("torchrun", "train.py")
    assert ts.exit_status == 1
    assert ts.world_size == 4  # the manifest knows of more ranks than left a capture
    # ended_at is set: the job is over, so a rank with no exit record vanished
    assert ts.ranks[0].exit.kind is ExitKind.VANISHED


def test_manifest_only_directory_loads_empty(tmp_path: Path) -> None:
    Manifest(command=("python", "t.py"), started_at=1.0, run_id="r", world_size=2).write(tmp_path)
    ts = load_capture_dir(tmp_path)
    assert ts.ranks == {} and ts.world_size == 2


def test_two_captures_of_one_rank_the_later_wins(tmp_path: Path) -> None:
    old = new_writer(tmp_path, 0, name="rank00000.node0.100.ndcap", meta=meta_for(0, started_ns=5))
    write_calls(old, 2)
    new = new_writer(tmp_path, 0, name="rank00000.node0.050.ndcap",
                     meta=meta_for(0, started_ns=9))
    write_calls(new, 7)
    ts = load_capture_dir(tmp_path)
    assert list(ts.ranks) == [0]
    assert ts.ranks[0].path == str(new.path) and len(ts.ranks[0].events) == 7
    (problem,) = ts.problems
    assert "rank 0" in problem and "several captures" in problem
    assert "using rank00000.node0.050.ndcap" in problem
    assert "ignoring rank00000.node0.100.ndcap" in problem


def test_unreadable_captures_are_reported_as_problems(tmp_path: Path) -> None:
    good = new_writer(tmp_path, 0)
    write_calls(good, 2)
    bad = tmp_path / "rank00001.node0.1.ndcap"
    bad.write_bytes(b"garbage" * 100)
    ts = load_capture_dir(tmp_path)
    assert list(ts.ranks) == [0]
    # rank 1 (its file's name says so) made a capture that cannot be read: damaged, never
    # "missing"; said once, as a note of the diagnosis, which is partial
    damaged = ts.unrecorded[1]
    assert damaged.damaged and damaged.host == "node0" and ts.world_size == 2
    assert damaged.why == (f"its capture {bad.name} is damaged (not an nccl-doctor capture file "
                           "(no capture header); 700 bytes)")
    assert ts.damaged_ranks() == {1} and not any(bad.name in p for p in ts.problems)
    d = analyze(ts)
    assert d.partial == "the capture of rank 1 is damaged"
    assert [n for n in d.notes if bad.name in n] == [
        f"rank 1 on node0: {damaged.why}: what it did is not seen; it is never blamed for what "
        "its file lost, and may be the rank others wait for; the diagnosis is partial"]
    assert not any(1 in f.ranks for f in d.findings)


def test_all_captures_unreadable_raises(tmp_path: Path) -> None:
    for rank in (0, 1):
        w = new_writer(tmp_path, rank)
        patch_file(w.path, 8, struct.pack("<I", 7))
    with pytest.raises(UnsupportedVersion):
        load_capture_dir(tmp_path)


def test_all_captures_unreadable_in_different_ways_raises_corrupt(tmp_path: Path) -> None:
    w = new_writer(tmp_path, 0)
    patch_file(w.path, 8, struct.pack("<I", 7))
    (tmp_path / "rank00001.node0.1.ndcap").write_bytes(b"garbage" * 100)
    with pytest.raises(CorruptCapture, match="none of the 2 capture files"):
        load_capture_dir(tmp_path)


def test_job_ended_turns_running_ranks_into_vanished(tmp_path: Path) -> None:
    a = new_writer(tmp_path, 0)
    write_calls(a, 3, finish_last=False)
    b = new_writer(tmp_path, 1)
    write_calls(b, 3)
    b.note("exit")
    live = load_capture_dir(tmp_path)  # no manifest: the job may still run
    assert live.ranks[0].exit.kind is ExitKind.RUNNING
    over = load_capture_dir(tmp_path, job_ended=True)
    assert over.ranks[0].exit.kind is ExitKind.VANISHED and over.ranks[0].exit.abnormal
    assert over.ranks[1].exit.kind is ExitKind.CLEAN
    _manifest(tmp_path, ended_at=5.0)
    assert load_capture_dir(tmp_path).ranks[0].exit.kind is ExitKind.VANISHED
    assert load_capture_dir(tmp_path, job_ended=False).ranks[0].exit.kind is ExitKind.RUNNING


@pytest.mark.parametrize("interrupt_after_exit", [False, True])
def test_a_clean_exit_after_the_users_interrupt_is_the_interrupts_doing(
        tmp_path: Path, interrupt_after_exit: bool) -> None:
    """A script that catches KeyboardInterrupt and returns exits cleanly - because of the
    interrupt; one that had finished before it came is simply done."""
    import time

    from nccl_doctor.capture import watch_record
    from nccl_doctor.watch_log import Interrupted
    w = new_writer(tmp_path)
    write_calls(w, 2)
    w.note("exit")
    at = time.time() + (5.0 if interrupt_after_exit else -5.0)
    watch_record.append_event(tmp_path, Interrupted(("SIGINT",), "user", at))
    ex = load_capture_dir(tmp_path, job_ended=True).ranks[0].exit
    if interrupt_after_exit:
        assert ex.kind is ExitKind.CLEAN
    else:
        assert ex.kind is ExitKind.STOPPED and ex.describe() == "was interrupted (SIGINT by the user)"


def test_doctor_errors_are_one_family() -> None:
    for cls in (CaptureNotFound, NotACapture, UnsupportedVersion, CorruptCapture):
        assert issubclass(cls, DoctorError)
    assert len({c.exit_status for c in (CaptureNotFound, NotACapture, UnsupportedVersion,
                                         CorruptCapture)}) == 4


# -- faults --------------------------------------------------------------------------------------

def test_parse_fault_abort() -> None:
    assert parse_fault(FAULT_TEXT) == ("SIGABRT", Location("/x/train.py", 12, "main"))


def test_parse_fault_skips_torch_frames_and_other_threads() -> None:
    text = (
        "Fatal Python error: Segmentation fault\n\n"
        "Thread 0x00007f00000001 (most recent call first):\n"
        '  File "/x/loader.py", line 5 in worker\n\n'
        "Current thread 0x00007f00000002 (most recent call first):\n"
        '  File "/venv/lib/python3.11/site-packages/torch/distributed/distributed_c10d.py", '
        "line 2501 in all_reduce\n"
        '  File "/x/train.py", line 33 in step\n'
    )
    assert parse_fault(text) == ("SIGSEGV", Location("/x/train.py", 33, "step"))


def test_parse_fault_without_a_fault() -> None:
    assert parse_fault("") is None
    assert parse_fault("some unrelated text\n") is None


def test_fault_file_makes_the_exit_a_signal(tmp_path: Path) -> None:
    w = new_writer(tmp_path)
    write_calls(w, 2, finish_last=False)
    w.path.with_suffix(".fault").write_text(FAULT_TEXT)
    trace = read_capture(w.path)
    assert trace.exit.kind is ExitKind.SIGNAL and trace.exit.abnormal
    assert trace.exit.signal == "SIGABRT"
    assert trace.exit.callsite == Location("/x/train.py", 12, "main")
    ts = load_capture_dir(tmp_path, job_ended=True)
    assert ts.ranks[0].exit.kind is ExitKind.SIGNAL  # not turned into VANISHED


def test_an_exception_then_an_abort_in_teardown_is_the_exception(tmp_path: Path) -> None:
    """The main thread's uncaught exception is recorded before the interpreter tears down, where
    a gloo/NCCL destructor may abort: the exception is how the rank ended, the abort its echo."""
    w = new_writer(tmp_path)
    write_calls(w, 2)
    w.note("exception", type="AssertionError", message="rank 1 disagrees", path="/x/test_a.py",
           line=11, function="test_a")
    w.path.with_suffix(".fault").write_text(FAULT_TEXT)
    ex = read_capture(w.path).exit
    assert ex.kind is ExitKind.EXCEPTION and ex.exception == "AssertionError: rank 1 disagrees"
    assert ex.callsite == Location("/x/test_a.py", 11, "test_a") and ex.signal == "SIGABRT"


def test_empty_fault_file_changes_nothing(tmp_path: Path) -> None:
    """The recorder creates the .fault file up front: an empty one means no fault."""
    w = new_writer(tmp_path)
    w.note("exit")
    w.path.with_suffix(".fault").write_text("")
    assert read_capture(w.path).exit.kind is ExitKind.CLEAN
