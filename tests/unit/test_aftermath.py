"""What became of the calls a hang was called on: completed (progress), or ended by the backend
(a consequence, never progress) - on a real NCCL run whose communicator NCCL's watchdog aborted
40 s after nccl-doctor called the hang, and on synthetic gloo traces."""

from __future__ import annotations

import tarfile
from pathlib import Path

from nccl_doctor.analysis.what.aftermath import stuck_calls_fate
from nccl_doctor.analysis.calls.loaded import load_capture_dir
from nccl_doctor.model import EventState

FIXTURE = Path(__file__).parent.parent / "fixtures" / "h100_nccl_shape_mismatch_report.tar.gz"


def test_nccl_watchdog_abort_after_the_hang_is_not_progress(tmp_path):
    with tarfile.open(FIXTURE) as tar:
        tar.extractall(tmp_path, filter="data")
    traces = load_capture_dir(tmp_path / "nccl_shape_mismatch.report")
    # when the hang was called: rank 0 in all_reduce #6, rank 1 in all_gather #5, both
    # returned on the CPU and in flight on the GPU (only Flight Recorder knew)
    fate = stuck_calls_fate(traces, {0: ("0", 6, True), 1: ("0", 5, True)}, {})
    assert not fate.completed
    assert any("rank 0 was killed by SIGABRT" in a for a in fate.aborted), fate.aborted
    assert any(a.startswith("rank 1") for a in fate.aborted), fate.aborted


def _gloo(tb, last_state):
    e0 = tb.collectives(2) + [tb.event(3, "broadcast", peer=0, state=last_state)]
    e1 = tb.collectives(2) + [tb.event(3, "broadcast", peer=0, state=last_state)]
    return tb.traceset([tb.trace(0, e0), tb.trace(1, e1)])


def test_a_stuck_call_that_returns_is_progress_one_that_fails_is_not(tb):
    stuck = {0: ("0", 3, False), 1: ("0", 3, False)}
    done = stuck_calls_fate(_gloo(tb, EventState.RETURNED), stuck, {})
    assert done.completed and not done.aborted
    failed = stuck_calls_fate(_gloo(tb, EventState.FAILED), stuck, {})
    assert not failed.completed and failed.aborted == (
        "rank 0's broadcast #3 (group 0) failed", "rank 1's broadcast #3 (group 0) failed")
    pending = stuck_calls_fate(_gloo(tb, EventState.ENTERED), stuck, {})
    assert not pending.completed and not pending.aborted


def test_flight_recorder_says_timed_out_or_completed(tb):
    traces = _gloo(tb, EventState.RETURNED)  # returned on the CPU: NCCL, in flight
    entry = {"op_id": 3, "collective_seq_id": 3, "process_group": ["0", "default_pg"],
             "profiling_name": "nccl:broadcast", "record_id": 2, "state": "scheduled",
             "retired": True}
    stuck = {0: ("0", 3, True)}
    timed_out = stuck_calls_fate(traces, stuck, {0: {"entries": [entry]}})
    assert not timed_out.completed and "timed out" in timed_out.aborted[0]
    finished = stuck_calls_fate(traces, stuck, {0: {"entries": [{**entry, "state": "completed"}]}})
    assert finished.completed and not finished.aborted


def test_a_real_format_1_capture_replays_without_call_paths(tmp_path):
    """Captures from before call paths (this H100 run's, format 1) replay as before - the
    user's line names each call - and a note says their paths were not recorded."""
    from nccl_doctor.analysis import analyze
    with tarfile.open(FIXTURE) as tar:
        tar.extractall(tmp_path, filter="data")
    traces = load_capture_dir(tmp_path / "nccl_shape_mismatch.report")
    assert not any(t.paths_recorded for t in traces.ranks.values())
    assert all(e.path == () for t in traces.ranks.values() for e in t.events)
    d = analyze(traces)
    root = d.root_cause
    assert root is not None and root.callsite and root.entry_callsite is None
    assert root.call_path == ()
    assert any("ranks 0, 1 recorded by an nccl-doctor from before call paths" in n
               for n in d.notes), d.notes
