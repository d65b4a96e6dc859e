"""The bulk reader (capture/reader.py ``read_columns``: a whole capture, its records as
columns) and the records' checks in C (capture/_ring.c through capture/records.py ``check``,
``read_ring``, ``distinct_rows``), held to what they stand in for: ``follow.scan_capture`` on
every kind of damage, and the numpy fallback (``NCCL_DOCTOR_PURE_PYTHON=1``) verdict for
verdict. And the window's second read (capture/capture_set.py): the records it keeps read
again from their slots, or the capture read afresh when it changed meanwhile."""

from __future__ import annotations

import os
import struct
from pathlib import Path

import numpy as np
import pytest

from nccl_doctor.analysis import analyze
from nccl_doctor.analysis.calls.loaded import load_capture_dir
from nccl_doctor.capture import capture_set, format as fmt, records
from nccl_doctor.capture.follow import scan_capture
from nccl_doctor.capture.capture_set import read_file as read_columns
from nccl_doctor.capture.window import Runs, Size
from nccl_doctor.capture.writer import CaptureWriter
from nccl_doctor.model import EventKind, EventState, ExitKind

T0 = 1_700_000_000_000_000_000


@pytest.fixture(params=["c", "numpy"])
def impl(request, monkeypatch):
    """Each test twice: the C checks, and the numpy fallback."""
    if request.param == "c" and not records.native():
        pytest.skip("the C extension is not built")
    monkeypatch.setenv("NCCL_DOCTOR_PURE_PYTHON", "1" if request.param == "numpy" else "0")
    return request.param


def writer(tmp_path: Path, rank: int = 0, capacity: int = 64) -> CaptureWriter:
    return CaptureWriter(tmp_path / f"rank{rank:05d}.node0.{100 + rank}{fmt.CAPTURE_SUFFIX}",
                         {"rank": rank, "world_size": 2, "host": "node0", "pid": 100 + rank,
                          "started_ns": T0}, capacity=capacity)


def calls(w: CaptureWriter, n: int, *, last_returns: bool = True, start: int = 1) -> list[int]:
    site = w.intern("/job/train.py")
    out = []
    for seq in range(start, start + n):
        idx = w.begin((0, T0 + seq * 1000, seq, 16, 7, w.intern("all_reduce"), w.intern("0"),
                       w.intern(f"float32[{seq % 3 + 1}]"), 0, site, 10 + seq % 5,
                       w.intern("step"), site, 10, 0, -1, 2, 0, int(EventKind.COLLECTIVE),
                       seq % 2, 0))
        if seq < start + n - 1 or last_returns:
            w.end(idx, int(EventState.RETURNED), 1)
        out.append(idx)
    return out


def slot_at(w: CaptureWriter, idx: int) -> int:
    return w.ring_offset + ((idx - 1) % w.capacity) * fmt.RECORD_SIZE


def patch(path: Path, offset: int, data: bytes) -> None:
    with open(path, "r+b") as fh:
        fh.seek(offset)
        fh.write(data)


def flip(path: Path, offset: int) -> None:
    with open(path, "r+b") as fh:
        fh.seek(offset)
        b = fh.read(1)
        fh.seek(offset)
        fh.write(bytes([b[0] ^ 0xFF]))


# -- damage: each a capture file -----------------------------------------------------------------

def clean(tmp_path):
    w = writer(tmp_path)
    calls(w, 20, last_returns=False)
    return w.path


def lapped(tmp_path):
    w = writer(tmp_path, capacity=16)
    calls(w, 41)
    w.note("exit")
    return w.path


def torn_enter(tmp_path):
    w = writer(tmp_path)
    calls(w, 12)
    w.note("exit")
    flip(w.path, slot_at(w, 4) + 20)
    return w.path


def torn_exit(tmp_path):
    w = writer(tmp_path)
    calls(w, 12)
    flip(w.path, slot_at(w, 7) + fmt.EXIT_OFFSET + 12)
    return w.path


def wrong_slot(tmp_path):
    w = writer(tmp_path)
    calls(w, 6)
    raw = w.path.read_bytes()
    patch(w.path, slot_at(w, 5), raw[slot_at(w, 2):slot_at(w, 2) + fmt.RECORD_SIZE])
    return w.path


def truncated_ring(tmp_path):
    w = writer(tmp_path, capacity=32)
    calls(w, 20)
    os.truncate(w.path, slot_at(w, 11) + 50)
    return w.path


def truncated_strings(tmp_path):
    w = writer(tmp_path)
    w.note("group", name="0", ranks=[0, 1])
    w.note("exit", padding="p" * 200)
    used = struct.unpack_from("<Q", w.path.read_bytes(), fmt.STRTAB_USED_OFFSET)[0]
    os.truncate(w.path, fmt.HEADER_SIZE + used - 20)
    return w.path


def corrupt_string(tmp_path):
    w = writer(tmp_path)
    calls(w, 3)
    used = struct.unpack_from("<Q", w.path.read_bytes(), fmt.STRTAB_USED_OFFSET)[0]
    w.note("exit")
    flip(w.path, fmt.HEADER_SIZE + used + fmt.STR_HEAD.size + 2)
    return w.path


def lost_string(tmp_path):
    """A record naming a string written after the table's counter: skipped, and counted."""
    w = writer(tmp_path)
    calls(w, 3)
    used = w._strtab_used
    op = w.intern("brand_new")
    idx = w.begin((0, T0, 9, 0, 7, op, w.intern("0"), 0, 0, 0, 0, 0, 0, 0, 0, -1, 2, 0,
                   int(EventKind.COLLECTIVE), 0, 0))
    w.end(idx, 1, 1)
    fmt.COUNTER.pack_into(w._mm, fmt.STRTAB_USED_OFFSET, used)
    patch(w.path, fmt.HEADER_SIZE + used, bytes(fmt.STR_HEAD.size))  # (no entry at the counter)
    return w.path


def counter_short(tmp_path):
    """Records past the header's counter: the whole ring is read, and that is said."""
    w = writer(tmp_path, capacity=256)
    calls(w, 150)
    fmt.COUNTER.pack_into(w._mm, fmt.EVENTS_STARTED_OFFSET, 10)
    return w.path


def counter_zero(tmp_path):
    w = writer(tmp_path)
    calls(w, 10)
    fmt.COUNTER.pack_into(w._mm, fmt.EVENTS_STARTED_OFFSET, 0)
    return w.path


def blanked(tmp_path):
    """Slots below the newest record zeroed, one near the ring's head and one deep."""
    w = writer(tmp_path, capacity=128)
    calls(w, 60)
    for idx in (3, 58):
        patch(w.path, slot_at(w, idx), bytes(fmt.RECORD_SIZE))
    return w.path


def faulted(tmp_path):
    w = writer(tmp_path)
    calls(w, 5, last_returns=False)
    w.path.with_suffix(fmt.FAULT_SUFFIX).write_text(
        "Fatal Python error: Aborted\n\nCurrent thread 0x1 (most recent call first):\n"
        '  File "/job/train.py", line 12 in main\n')
    return w.path


def empty_ring(tmp_path):
    w = writer(tmp_path)
    w.note("exit")
    return w.path


DAMAGE = [clean, lapped, torn_enter, torn_exit, wrong_slot, truncated_ring, truncated_strings,
          corrupt_string, lost_string, counter_short, counter_zero, blanked, faulted, empty_ring]


@pytest.mark.parametrize("make", DAMAGE, ids=[f.__name__ for f in DAMAGE])
def test_a_bulk_read_holds_what_a_scan_holds(tmp_path, impl, make):
    path = make(tmp_path)
    scan, bulk = scan_capture(path), read_columns(path)
    assert (bulk.meta, bulk.strings, bulk.notes, bulk.exit, bulk.paths) == \
        (scan.meta, scan.strings, scan.notes, scan.exit, scan.paths)
    assert bulk.integrity == scan.integrity
    d = scan.decoded
    for name in records.FIELDS:
        assert np.array_equal(bulk.cols[name], d.rows[name]), name
    assert np.array_equal(bulk.exited, d.exited) and np.array_equal(bulk.slots, d.slots)
    assert np.array_equal(bulk.torn_slots, d.torn_slots)
    assert np.array_equal(bulk.rows()[list(records.FIELDS)], d.rows[list(records.FIELDS)])


def test_the_damage_is_read_as_damage(tmp_path, impl):
    """(what the cases above compare is there to compare)"""
    for name in "abcdefgh":
        (tmp_path / name).mkdir()
    assert read_columns(torn_enter(tmp_path / "a")).integrity.torn_records == 1
    assert read_columns(torn_exit(tmp_path / "b")).integrity.torn_records == 1
    assert read_columns(lost_string(tmp_path / "c")).integrity.unnamed_records == 1
    assert read_columns(counter_short(tmp_path / "d")).integrity.miscounted
    assert read_columns(blanked(tmp_path / "e")).integrity.blank_records == 2
    assert read_columns(truncated_ring(tmp_path / "f")).integrity.truncated
    assert read_columns(faulted(tmp_path / "g")).exit.kind is ExitKind.SIGNAL
    assert len(read_columns(lapped(tmp_path / "h"))) == 16


# -- the checks in C and in numpy -----------------------------------------------------------------

def damaged_ring(tmp_path: Path) -> tuple[np.ndarray, np.ndarray]:
    w = writer(tmp_path, capacity=4096)
    calls(w, 3000)
    raw = w.path.read_bytes()[w.ring_offset:w.ring_offset + 3100 * fmt.RECORD_SIZE]
    rows = records.as_records(raw).copy()
    rng = np.random.default_rng(7)
    flat = rows.view(np.uint8).reshape(len(rows), fmt.RECORD_SIZE)
    for _ in range(900):  # bit flips anywhere: enter parts, checks, exit parts, padding
        flat[rng.integers(len(rows)), rng.integers(fmt.RECORD_SIZE)] ^= 1 << rng.integers(8)
    rows["t_exit"][100:110] = 0
    rows["exit_check"][200:210] = 0
    rows["state"][300:305] = 9
    rows["kind"][400:403] = 77
    rows["t_exit"][500:505] = rows["exit_check"][500:505] = 0  # still inside
    return rows, np.arange(len(rows))


def test_the_verdicts_in_c_are_numpy_s(tmp_path):
    if not records.native():
        pytest.skip("the C extension is not built")
    rows, slots = damaged_ring(tmp_path)
    for at in (slots, slots + 1, slots[::-1].copy()):  # in their slots, and not
        c = records.check(rows, at, 4096)
        assert np.array_equal(c, records.check_numpy(rows, at, 4096))
    assert set(records.check(rows, slots, 4096).tolist()) == {
        records.BLANK, records.DAMAGED, records.ENTERED, records.EXITED, records.CUT_EXIT}


def test_a_ring_read_in_c_splits_as_numpy_does(tmp_path, monkeypatch):
    if not records.native():
        pytest.skip("the C extension is not built")
    rows, _ = damaged_ring(tmp_path)
    path = tmp_path / "ring.bin"
    path.write_bytes(b"x" * 100 + rows.tobytes()[:-70])  # the last record cut by the end
    fd = os.open(path, os.O_RDONLY)
    try:
        made = {}
        for mode in ("0", "1"):
            monkeypatch.setenv("NCCL_DOCTOR_PURE_PYTHON", mode)
            made[mode] = records.read_ring(fd, 100, 0, len(rows) + 5, 4096)
    finally:
        os.close(fd)
    c, py = made["0"], made["1"]
    assert np.array_equal(c.verdicts, py.verdicts) and c.verdicts[-6:].tolist() == [0] * 6
    assert np.array_equal(c.exited, py.exited) and np.array_equal(c.slots, py.slots)
    for name in records.FIELDS:
        assert np.array_equal(c.cols[name], py.cols[name]), name


def test_distinct_rows_are_numbered_as_the_rows_first_show_them(monkeypatch):
    rng = np.random.default_rng(3)
    for trial in range(30):
        n = int(rng.integers(0, 2000))
        cols = [rng.integers(0, int(rng.integers(1, 6)), n).astype(np.uint64)
                * np.uint64(rng.integers(1, 2**62)) for _ in range(int(rng.integers(1, 8)))]
        made = []
        for mode in ("0", "1"):
            monkeypatch.setenv("NCCL_DOCTOR_PURE_PYTHON", mode)
            made.append(records.distinct_rows(cols))
        (inverse, first), (inverse2, first2) = made
        assert np.array_equal(inverse, inverse2) and np.array_equal(first, first2), trial
        rows = [tuple(int(c[i]) for c in cols) for i in range(n)]
        seen: dict[tuple, int] = {}
        assert inverse.tolist() == [seen.setdefault(r, len(seen)) for r in rows]
        assert first.tolist() == [rows.index(r) for r in seen]


# -- the window's second read -------------------------------------------------------------------

def test_runs_hold_a_ring_s_indices_and_slots():
    idx = np.array([5, 6, 7, 9, 10, 30, 31, 32, 33])
    runs = Runs.of(idx)
    assert len(runs.starts) == 3 and runs.at(np.arange(9)).tolist() == idx.tolist()
    assert runs.find(np.array([4, 5, 8, 10, 29, 33, 34])).tolist() == [-1, 0, -1, 4, -1, 8, -1]
    lap = Runs.of(np.r_[np.arange(12, 16), np.arange(0, 12)])
    assert lap.at(np.array([0, 3, 4, 15])).tolist() == [12, 15, 0, 11]
    assert Runs.of(np.zeros(0)).find(np.array([1])).tolist() == [-1]


def job(root: Path, calls_each: int = 300, hang: bool = True) -> Path:
    out = root / "capture"
    out.mkdir()
    for rank in range(2):
        w = writer(out, rank, capacity=1024)
        w.note("group", name="0", ranks=[0, 1], backend="gloo")
        calls(w, calls_each - rank, last_returns=not hang)  # rank 1 stops a call short
    return out


def report(out: Path, **kw) -> dict:
    d = analyze(load_capture_dir(out, **kw)).to_json()
    d["notes"] = [n for n in d["notes"] if "records compared across" not in n]
    return d


def test_a_window_read_in_c_and_in_numpy_says_what_every_record_says(tmp_path, impl):
    out = job(tmp_path)
    full = report(out)
    assert full == report(out, window=Size(above=0, tails=0, tail=6))
    assert "missing_collective" in {f["kind"] for f in full["findings"]}


def test_a_capture_changed_before_its_second_read_is_read_afresh(tmp_path, monkeypatch):
    """Rank 0's last call returns between the window's two reads of its capture: its rows are
    not what the first read found, so the capture is read again whole - what it holds now."""
    out = job(tmp_path)
    path = out / f"rank00000.node0.100{fmt.CAPTURE_SUFFIX}"
    keep, fresh = capture_set.window.keep, []

    def keep_then_return(rank, points, tail):
        if not fresh:
            returned(path, int(rank.idx.at(np.array([rank.n - 1]))[0]))
            fresh.append(True)
        return keep(rank, points, tail)

    monkeypatch.setattr(capture_set.window, "keep", keep_then_return)
    read = []
    reread = capture_set._reread
    monkeypatch.setattr(capture_set, "_reread", lambda *a: read.append(reread(*a)) or read[-1])
    traces = load_capture_dir(out, window=Size(above=0, tails=0, tail=6))
    assert read[0] is None and read[1] is not None  # rank 0 changed, rank 1 did not
    last = traces.ranks[0].events[-1]
    assert last.state is EventState.RETURNED and traces.ranks[0].recorded == 300


def returned(path: Path, idx: int) -> None:
    """Record ``idx``'s exit part written, as its rank's ring writes it when the call returns."""
    head = fmt.HEADER.unpack_from(path.read_bytes()[:fmt.HEADER.size], 0)
    capacity, ring_offset = head[4], head[5]
    t_exit, state = T0 + 10**9, int(EventState.RETURNED)
    patch(path, ring_offset + ((idx - 1) % capacity) * fmt.RECORD_SIZE + fmt.EXIT_OFFSET,
          fmt.EXIT.pack(t_exit, 1, state, fmt.exit_check(idx, t_exit, 1, state)))


def test_a_windowed_read_keeps_no_capture_whole(tmp_path):
    out = job(tmp_path)
    captures = capture_set.CaptureSet(out, window=Size(above=100, tails=0, tail=6),
                                      replay=False)
    made = captures._read_all()
    assert all(not m.whole and not len(m.capture.exited) for m in made.values())
    small = capture_set.CaptureSet(out, replay=False)._read_all()
    assert all(m.whole and len(m.capture.exited) == m.outline.n for m in small.values())
