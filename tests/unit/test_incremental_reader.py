"""The incremental reader (capture/follow.py) and the columnar decoding (capture/records.py)
against a reference: a record-by-record ``struct`` decoder written here from the format's
specification (format.py), as the reader was before it became columnar.

A follower that read the file many times while it was written must hold exactly what one fresh
read of the file holds: across laps of the ring, torn records and exit parts, strings written
after the records that name them, and a writer thread racing the reader.
"""

from __future__ import annotations

import json
import random
import threading
import zlib
from pathlib import Path

import pytest

from nccl_doctor.capture import format as fmt
from nccl_doctor.capture.follow import CaptureFollower, read_capture
from nccl_doctor.capture.writer import CaptureWriter
from nccl_doctor.model import EventKind, EventState


def reference(path: Path) -> tuple[list[tuple], int, int]:
    """(events as tuples, torn, overwritten) decoded one record at a time with ``struct``."""
    data = path.read_bytes()
    _m, _v, _h, _r, capacity, ring_off, str_off, _size, _c = fmt.HEADER.unpack_from(data, 0)
    (used,) = fmt.COUNTER.unpack_from(data, fmt.STRTAB_USED_OFFSET)
    strings, pos = {0: ""}, str_off
    while pos + fmt.STR_HEAD.size <= str_off + used:
        length, kind, sid = fmt.STR_HEAD.unpack_from(data, pos)
        body = data[pos + 4:pos + fmt.STR_HEAD.size + length]
        (crc,) = fmt.CRC.unpack_from(data, pos + fmt.STR_HEAD.size + length)
        assert zlib.crc32(body) == crc
        if kind == fmt.StrKind.STRING:
            strings[sid] = body[8:].decode()
        pos += fmt.STR_HEAD.size + length + 4
    events, torn, count = [], 0, 0
    for slot in range(capacity):
        off = ring_off + slot * fmt.RECORD_SIZE
        if not any(data[off:off + fmt.RECORD_SIZE]):
            continue
        enter = data[off:off + fmt.ENTER.size]
        f = fmt.ENTER.unpack(enter)
        if (zlib.adler32(enter) != fmt.CRC.unpack_from(data, off + fmt.ENTER.size)[0]
                or f[0] < 1 or (f[0] - 1) % capacity != slot or f[19] not in set(EventKind)):
            torn += 1
            continue
        count = max(count, f[0])
        t_exit, delta, state, check = fmt.EXIT.unpack_from(data, off + fmt.EXIT_OFFSET)
        done = t_exit and check == fmt.exit_check(f[0], t_exit, delta, state) and state in (1, 2, 3)
        if not done and (t_exit or check):
            torn += 1
        events.append((f[0], f[1], strings.get(f[6], "<?>"), strings.get(f[7], "<?>"), f[3],
                       strings.get(f[8], ""), f[20], EventState(state) if done else
                       EventState.ENTERED, delta if done else None, t_exit if done else None,
                       strings.get(f[10], "<?>") if f[10] else None, f[11] if f[10] else 0))
    return sorted(events), torn, max(0, count - capacity)


def as_tuples(trace) -> list[tuple]:
    return [(e.idx, e.parent, e.op, e.group, e.seq, e.input, int(e.flags), e.state, e.seq_delta,
             e.t_exit_ns, e.callsite.path if e.callsite else None,
             e.callsite.line if e.callsite else 0) for e in trace.events]


def same_as_reference(trace, path: Path) -> None:
    events, torn, overwritten = reference(path)
    assert as_tuples(trace) == events
    assert (trace.integrity.torn_records, trace.integrity.overwritten) == (torn, overwritten)


class Job:
    """A rank's writer with a random mix of calls; some never return (still running)."""

    def __init__(self, path: Path, capacity: int, seed: int = 0) -> None:
        self.w = CaptureWriter(path, {"rank": 0, "pid": 1}, capacity=capacity)
        self.rng = random.Random(seed)
        self.seq: dict[str, int] = {}

    def call(self, *, returns: bool | None = None) -> int:
        rng, w = self.rng, self.w
        group = rng.choice(["0", "1", "2"])
        self.seq[group] = self.seq.get(group, 0) + 1
        op = w.intern(rng.choice(["all_reduce", "all_gather", "broadcast", f"op{rng.randrange(50)}"]))
        site = w.intern(f"/job/train_{rng.randrange(5)}.py")
        idx = w.begin((0, 0, self.seq[group], 64, 7, op, w.intern(group),
                       w.intern(f"float32[{rng.randrange(1, 9)}]"), 0, site, rng.randrange(1, 500),
                       w.intern("step"), site, 3, 0, -1, 2, 0, int(EventKind.COLLECTIVE),
                       rng.choice([0, 1]), 0))
        if returns if returns is not None else rng.random() < 0.9:
            w.end(idx, rng.choice([1, 1, 1, 2, 3]), 1)
        return idx


@pytest.mark.parametrize("capacity", [16, 64, 1024])
def test_a_follower_read_many_times_holds_what_one_fresh_read_holds(tmp_path, capacity):
    job = Job(tmp_path / "r.ndcap", capacity, seed=capacity)
    follower = CaptureFollower(job.w.path)
    pending: list[int] = []
    for step in range(60):
        for _ in range(job.rng.choice([0, 1, 3, 17, capacity + 5])):  # some batches lap it
            returns = job.rng.random() < 0.7
            idx = job.call(returns=returns)
            if not returns:
                pending.append(idx)
        for idx in job.rng.sample(pending, min(len(pending), 3)):  # calls that return later
            job.w.end(idx, 1, 1)
            pending.remove(idx)
        if step % 7 == 0:
            job.w.note("exit" if step == 56 else "group", name=str(step), ranks=[0, 1])
        live = follower.read()
        fresh = read_capture(job.w.path)
        assert live == fresh
        same_as_reference(live, job.w.path)
    follower.close()


def test_a_read_with_nothing_new_is_the_same_object_and_reads_only_the_header(tmp_path):
    job = Job(tmp_path / "r.ndcap", 256)
    for _ in range(100):
        job.call(returns=True)
    with CaptureFollower(job.w.path) as follower:
        first = follower.read()
        assert follower.read() is first
        job.call(returns=False)  # a call still running: its slot is watched until it returns
        second = follower.read()
        assert second is not first and second.events[-1].state is EventState.ENTERED
        assert follower.read() is second
        job.w.end(second.events[-1].idx, 1, 1)
        third = follower.read()
        assert third.events[-1].state is EventState.RETURNED
        assert third == read_capture(job.w.path)


def _scribble(path: Path, offset: int, data: bytes) -> None:
    with path.open("r+b") as fh:
        fh.seek(offset)
        fh.write(data)


def test_torn_records_and_torn_exits_count_as_a_fresh_read_counts_them(tmp_path):
    job = Job(tmp_path / "r.ndcap", 1024, seed=3)
    with CaptureFollower(job.w.path) as follower:
        for _ in range(400):
            job.call(returns=True)
        follower.read()
        ring = job.w.ring_offset
        _scribble(job.w.path, ring + 5 * fmt.RECORD_SIZE + 30, b"\xff\xfe")  # an enter part
        _scribble(job.w.path, ring + 9 * fmt.RECORD_SIZE + fmt.EXIT_OFFSET, b"\x01" * 8)  # exit
        idx = job.call(returns=False)  # a record whose exit is half written
        _scribble(job.w.path, ring + ((idx - 1) % 1024) * fmt.RECORD_SIZE + fmt.EXIT_OFFSET,
                  b"\x07\x00\x00\x00")
        # the corrupted slots were settled: only a lap or a fresh follower sees them. A live
        # follower looks at the slots that can change: the unsettled one it sees.
        live = follower.read()
        assert live.integrity.torn_records == 1
        fresh = read_capture(job.w.path)
        assert fresh.integrity.torn_records == 3
        same_as_reference(fresh, job.w.path)
        for _ in range(1100):  # a lap rewrites every slot: both agree again
            job.call(returns=True)
        assert follower.read() == read_capture(job.w.path)
        same_as_reference(follower.read(), job.w.path)


def test_a_record_naming_a_string_not_yet_read_is_named_once_the_string_is_read(tmp_path):
    job = Job(tmp_path / "r.ndcap", 64)
    w = job.w
    with CaptureFollower(w.path) as follower:
        job.call(returns=True)
        follower.read()
        group = w.intern("0")
        used = w._strtab_used
        op = w.intern("all_to_all_brand_new")
        # the reader's view of the table as it was before the string: the record names an id
        # the table it read does not hold
        fmt.COUNTER.pack_into(w._mm, fmt.STRTAB_USED_OFFSET, used)
        idx = w.begin((0, 0, 9, 64, 7, op, group, 0, 0, 0, 0, 0, 0, 0, 0, -1, 2, 0,
                       int(EventKind.COLLECTIVE), 0, 0))
        w.end(idx, 1, 1)
        assert follower.read().events[-1].op == "<?>"
        fmt.COUNTER.pack_into(w._mm, fmt.STRTAB_USED_OFFSET, w._strtab_used)
        assert follower.read().events[-1].op == "all_to_all_brand_new"
        assert follower.read() == read_capture(w.path)


@pytest.mark.parametrize("pure_python", ["1", "0"])
def test_a_writer_thread_racing_the_reader(tmp_path, monkeypatch, pure_python):
    monkeypatch.setenv("NCCL_DOCTOR_PURE_PYTHON", pure_python)
    job = Job(tmp_path / "r.ndcap", 512, seed=11)
    stop = threading.Event()

    def write() -> None:
        while not stop.is_set():
            job.call()
        job.w.note("exit")

    def write_more() -> None:  # a second thread: records race for indices and the counter
        rng = random.Random(5)
        for _ in range(3000):
            idx = job.w.begin((0, 0, -1, 0, 8, job.w.intern("send"), job.w.intern("0"), 0, 0, 0,
                               0, 0, 0, 0, 0, 1, 2, 0, int(EventKind.P2P), 1, 0))
            if rng.random() < 0.95:
                job.w.end(idx, 3, 0)

    threads = [threading.Thread(target=write), threading.Thread(target=write_more)]
    follower = CaptureFollower(job.w.path)
    for t in threads:
        t.start()
    reads = 0
    while threads[1].is_alive() or reads < 50:
        trace = follower.read()
        idxs = [e.idx for e in trace.events]
        assert idxs == sorted(set(idxs))  # never a record twice, always in order
        assert all(e.op != "<?>" or e.idx in _unsettled(follower) for e in trace.events)
        reads += 1
    stop.set()
    for t in threads:
        t.join()
    assert job.w.count > 3000
    live = follower.read()
    assert live == read_capture(job.w.path)
    same_as_reference(live, job.w.path)
    assert live.exit.kind.value == "exit"
    follower.close()


def _unsettled(follower: CaptureFollower) -> set[int]:
    return {follower._slots[s][0] for s in follower._open if s in follower._slots}


def test_a_fresh_read_of_a_capture_with_no_counter_scans_the_whole_ring(tmp_path):
    job = Job(tmp_path / "r.ndcap", 64)
    for _ in range(10):
        job.call(returns=True)
    fmt.COUNTER.pack_into(job.w._mm, fmt.EVENTS_STARTED_OFFSET, 0)  # a damaged counter
    trace = read_capture(job.w.path)
    assert [e.idx for e in trace.events] == list(range(1, 11))
    same_as_reference(trace, job.w.path)


def test_notes_written_while_followed_are_read_once_each(tmp_path):
    job = Job(tmp_path / "r.ndcap", 64)
    with CaptureFollower(job.w.path) as follower:
        for i in range(30):
            job.w.note("rng", step=i)
            if i % 4 == 0:
                follower.read()
        notes = follower.read().notes
    assert [n["step"] for n in notes] == list(range(30))
    assert json.loads(json.dumps(notes[0]))["note"] == "rng"
