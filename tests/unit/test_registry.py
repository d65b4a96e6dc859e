"""The supervisor's registry of ranks (supervisor/probe.py ``Registry``), polled five times a
second: a capture joins when it appears, its counters are read from its mapped header as the
rank writes, a restarted rank's newer capture replaces the old one, a capture still being
created waits for its header, and a folder whose time did not move is listed again after
``RESCAN_S`` all the same."""

from __future__ import annotations

import os
from pathlib import Path

from nccl_doctor.capture import format as fmt
from nccl_doctor.capture.writer import CaptureWriter
from nccl_doctor.model import EventKind, EventState
from nccl_doctor.supervisor.probe import Registry


def writer(directory: Path, rank: int, pid: int, started_ns: int = 1) -> CaptureWriter:
    meta = {"rank": rank, "world_size": 2, "host": "node0", "pid": pid, "local_rank": rank,
            "started_ns": started_ns, "run_id": "t"}
    return CaptureWriter(directory / f"rank{rank:05d}.node0.{pid}{fmt.CAPTURE_SUFFIX}", meta)


def call(w: CaptureWriter, seq: int) -> None:
    op, group = w.intern("all_reduce"), w.intern("0")
    idx = w.begin((0, 1000 + seq, seq, 16, 7, op, group, 0, 0, 0, 0, 0, 0, 0, 0, -1, 2, 0,
                   int(EventKind.COLLECTIVE), 0, 0))
    w.end(idx, int(EventState.RETURNED), 1)


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_captures_join_as_they_appear_and_their_counters_move_as_ranks_write(tmp_path):
    registry = Registry(tmp_path)
    assert registry.poll() == {}
    a = writer(tmp_path, 0, 11)
    assert registry.poll() == {0: 0}
    for seq in range(1, 4):
        call(a, seq)
    b = writer(tmp_path, 1, 12)
    call(b, 1)
    assert registry.poll() == {0: 3, 1: 1}
    notes = registry.notes[0]
    assert a.note("lifecycle", what="x")
    call(a, 4)
    assert registry.poll() == {0: 4, 1: 1}
    assert registry.notes[0] > notes  # (a note moves the second counter)
    registry.close()


def test_a_restarted_ranks_newer_capture_replaces_the_old_and_a_gone_file_is_let_go(tmp_path):
    registry = Registry(tmp_path)
    old = writer(tmp_path, 0, 11, started_ns=1)
    call(old, 1)
    assert registry.poll() == {0: 1}
    new = writer(tmp_path, 0, 21, started_ns=2)
    assert registry.poll() == {0: 0} and registry.ranks[0].pid == 21
    old.path.unlink()
    assert registry.poll() == {0: 0}
    assert old.path not in registry._maps  # (its mapping closed)
    call(new, 1)
    assert registry.poll() == {0: 1}


def test_a_capture_still_being_created_waits_for_its_header(tmp_path):
    registry = Registry(tmp_path)
    path = tmp_path / f"rank00000.node0.11{fmt.CAPTURE_SUFFIX}"
    path.write_bytes(bytes(100))  # (the writer has not written the header yet)
    assert registry.poll() == {}
    path.unlink()
    w = writer(tmp_path, 0, 11)
    call(w, 1)
    assert registry.poll() == {0: 1}


def test_a_folder_is_listed_again_while_its_time_is_fresh_and_not_after(tmp_path):
    """A coarse filesystem may give a change made in the tick of the last listing the same
    time: while the folder's time is that recent, each poll lists it again; long after, a
    folder whose time did not move is not listed (a long wait costs no listing)."""
    writer(tmp_path, 0, 11)
    then = os.stat(tmp_path).st_mtime_ns
    clock = Clock()
    clock.now = then / 1e9 + 0.5  # (half a second after the folder's last change)
    registry = Registry(tmp_path, clock=clock)
    assert registry.poll() == {0: 0}
    writer(tmp_path, 1, 12)
    os.utime(tmp_path, ns=(then, then))  # (the same time: a filesystem whose times are coarse)
    assert registry.poll() == {0: 0, 1: 0}  # listed again all the same: the time is fresh
    clock.now += 10
    writer(tmp_path, 2, 13)
    os.utime(tmp_path, ns=(then, then))
    assert registry.poll() == {0: 0, 1: 0}  # long after: the time says nothing changed
    os.utime(tmp_path)  # (its time moves, as it does when a file is made)
    assert registry.poll() == {0: 0, 1: 0, 2: 0}


def test_a_process_read_from_proc_says_what_psutil_says():
    """proc_state reads /proc/PID/stat itself on Linux (a watchdog look reads every rank's):
    the same status and CPU seconds as psutil, for a running, a sleeping, a zombie and a gone
    process."""
    import subprocess
    import time

    from nccl_doctor.supervisor.probe import _psutil_state, proc_state

    child = subprocess.Popen(["sleep", "30"])
    try:
        time.sleep(0.2)
        for pid in (os.getpid(), child.pid):
            fast, slow = proc_state(pid), _psutil_state(pid)
            assert (fast.alive, fast.status) == (slow.alive, slow.status) or \
                fast.status in ("running", "sleeping"), (fast, slow)
            assert abs(fast.cpu_seconds - slow.cpu_seconds) < 0.05, (fast, slow)
        assert proc_state(child.pid).status == "sleeping"
        child.kill()
        time.sleep(0.2)
        assert proc_state(child.pid) == _psutil_state(child.pid)
        assert (proc_state(child.pid).alive, proc_state(child.pid).status) == (False, "zombie")
    finally:
        child.kill()
        child.wait()
    assert (proc_state(child.pid).alive, proc_state(child.pid).status) == (False, "gone")
