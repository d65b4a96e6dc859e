"""Flight Recorder entries (shape as dumped by torch 2.13 on gloo) as events, merged by seq."""

from __future__ import annotations

from nccl_doctor.analysis import analyze
from nccl_doctor.capture.flight_recorder import IDX_BASE, events_from_dump, merge
from nccl_doctor.diagnosis import FindingKind
from nccl_doctor.model import EventState

T0 = 1_700_000_000_000_000_000


def entry(record_id: int, op_id: int, name: str, retired: bool, sizes=((36,),), coll=None,
          p2p=False) -> dict:
    # the keys of a real entry from _dump_fr_trace_json (torch 2.13.0+cpu, gloo)
    return {
        "record_id": record_id, "pg_id": 0, "process_group": ["0", "default_pg"],
        "collective_seq_id": coll if coll is not None else op_id, "p2p_seq_id": 0,
        "op_id": op_id, "profiling_name": f"gloo:{name}", "is_p2p": p2p,
        "input_sizes": [list(s) for s in sizes], "input_dtypes": ["Float"] * len(sizes),
        "output_sizes": [list(s) for s in sizes], "output_dtypes": ["Float"] * len(sizes),
        "state": "scheduled", "retired": retired, "time_created_ns": T0 + op_id,
        "thread_id": 7, "thread_name": "pt_main_thread", "timeout_ms": 1800000,
    }


def test_entries_become_collective_events() -> None:
    events = events_from_dump({"entries": [
        entry(0, 1, "all_reduce", True), entry(1, 3, "broadcast", False, coll=2),
        entry(2, 2, "send", True, p2p=True),
    ]})
    assert [(e.op, e.seq, e.align_seq, e.state) for e in events] == [
        ("all_reduce", 1, 1, EventState.RETURNED), ("broadcast", 3, 2, EventState.ENTERED),
    ]
    assert events[0].input == "float32[36]" and events[0].idx == IDX_BASE
    # no stack: no place, never a placeholder standing for one
    assert events[1].callsite is None and events[1].api_callsite is None and not events[1].path


def test_a_dump_read_alone_gives_each_entry_its_call_path() -> None:
    """A pickled dump's entries carry their Python stack: the call path and the issuing line
    (trl's, past accelerate's helper) come from it as from a capture."""
    site = "/v/lib/python3.11/site-packages/"
    frames = [{"filename": site + "torch/distributed/distributed_c10d.py", "line": 3700,
               "name": "all_gather"},
              {"filename": site + "accelerate/utils/operations.py", "line": 380, "name": "gather"},
              {"filename": site + "trl/trainer/cpo_trainer.py", "line": 839,
               "name": "get_batch_loss_metrics"},
              {"filename": site + "transformers/trainer.py", "line": 3700, "name": "training_step"},
              {"filename": "/job/train.py", "line": 16, "name": "<module>"},
              {"filename": "/usr/lib/python3.11/runpy.py", "line": 88, "name": "_run_code"}]
    (e,) = events_from_dump({"entries": [{**entry(0, 1, "all_gather", False), "frames": frames}]})
    assert [(loc.path.rpartition("/")[2], loc.line) for loc in e.path] == [
        ("operations.py", 380), ("cpo_trainer.py", 839), ("trainer.py", 3700), ("train.py", 16)]
    assert e.callsite.path == "/job/train.py" and e.issuing.function == "get_batch_loss_metrics"


def test_a_call_from_autograds_thread_is_said_to_come_from_backward() -> None:
    """On CUDA, backward runs on autograd's device threads (pt_autograd_0: seen on an H100 with
    torch 2.11, NCCL 2.28.9), which hold no Python stack: DDP's gradient all_reduce there has no
    frames in Flight Recorder's dump, and its thread says what made it."""
    (e,) = events_from_dump({"entries": [{**entry(0, 1, "all_reduce", False),
                                          "thread_name": "pt_autograd_0", "frames": []}]})
    assert e.callsite is None and e.context == "issued from C++ during backward"
    (main,) = events_from_dump({"entries": [{**entry(0, 1, "all_reduce", False), "frames": []}]})
    assert main.context == ""


def test_malformed_entries_are_skipped() -> None:
    good = entry(3, 4, "all_reduce", True)
    dump = {"entries": [None, {"op_id": "x"}, {**good, "process_group": []}, good, 5]}
    assert [e.seq for e in events_from_dump(dump)] == [4]
    assert events_from_dump({"entries": "nope"}) == [] == events_from_dump({})


def test_merge_fills_what_the_recorder_missed_and_finds_the_desync(tb) -> None:
    # rank 1 is recorded in barrier #3; rank 0 recorded nothing (DDP issues from C++)
    rank1 = [tb.event(1, seq=1, input="float32[36]"), tb.event(2, seq=2, input="float32[36]"),
             tb.event(3, "barrier", seq=3, input="", state=EventState.ENTERED)]
    traces = tb.traceset([tb.trace(0, [], tb.RUNNING), tb.trace(1, rank1, tb.RUNNING)],
                         groups={"0": (0, 1)})
    assert analyze(traces).root_cause.kind is FindingKind.MISSING_COLLECTIVE
    dumps = {0: {"entries": [entry(0, 1, "all_reduce", True), entry(1, 2, "all_reduce", True),
                             entry(2, 3, "all_reduce", False)]},
             1: {"entries": [entry(0, 1, "all_reduce", True), entry(1, 2, "all_reduce", True),
                             entry(2, 3, "barrier", False, sizes=())]}}
    merged = merge(traces, dumps)
    assert len(merged.ranks[1].events) == 3  # rank 1's own records win: nothing duplicated
    assert [e.op for e in merged.ranks[0].events] == ["all_reduce"] * 3
    root = analyze(merged).root_cause
    assert root.kind is FindingKind.COLLECTIVE_MISMATCH and root.seq == 3
    assert {s["op"] for s in root.evidence["sides"]} == {"all_reduce", "barrier"}


def nccl(record_id: int, op_id: int, state: str, retired: bool, coll: int | None = None) -> dict:
    # NCCL entries move state scheduled -> started -> completed (torch FlightRecorder.hpp)
    return {**entry(record_id, op_id, "all_reduce", retired, coll=coll),
            "profiling_name": "nccl:all_reduce", "state": state}


def test_nccl_entries_use_the_collective_count_and_stream_order() -> None:
    # ProcessGroupNCCL's sequence number (what the recorder records) counts collectives only;
    # op_id also counts p2p ops (two sends here) and each op of a coalesced group
    events = events_from_dump({"entries": [
        nccl(0, 1, "completed", True, coll=1),
        nccl(1, 4, "scheduled", False, coll=2),  # a coalesced op's own entry: no CUDA events
        nccl(2, 5, "completed", True, coll=3),  # later on the same stream: so #2 is done too
        nccl(3, 6, "started", False, coll=4),
    ]})
    assert [(e.seq, e.align_seq, e.state) for e in events] == [
        (1, 1, EventState.RETURNED), (2, 2, EventState.RETURNED), (3, 3, EventState.RETURNED),
        (4, 4, EventState.ENTERED)]


def test_nccl_completion_is_the_state_not_retirement() -> None:
    events = events_from_dump({"entries": [
        nccl(0, 1, "completed", True), nccl(1, 2, "started", False),
        nccl(2, 3, "scheduled", True),  # retired but not completed: it timed out
    ]})
    assert [e.state for e in events] == [EventState.RETURNED, EventState.ENTERED,
                                         EventState.ENTERED]


def test_returned_calls_not_completed_on_the_gpu_become_waits(tb) -> None:
    # both ranks' Python calls returned (NCCL enqueues and returns); rank 0 issued #3, rank 1
    # never did; Flight Recorder: rank 0's #2 completed, #3 and #4 did not
    rank0 = [tb.event(i, seq=i, input="float32[36]") for i in (1, 2, 3, 4)]
    rank1 = [tb.event(i, seq=i, input="float32[36]") for i in (1, 2)]
    traces = tb.traceset([tb.trace(0, rank0, tb.RUNNING), tb.trace(1, rank1, tb.RUNNING)],
                         groups={"0": (0, 1)})
    dumps = {0: {"entries": [nccl(0, 1, "completed", True), nccl(1, 2, "completed", True),
                             nccl(2, 3, "started", False), nccl(3, 4, "scheduled", False)]},
             1: {"entries": [nccl(0, 1, "completed", True), nccl(1, 2, "completed", True)]}}
    merged = merge(traces, dumps)
    states = [(e.seq, e.state, e.in_flight) for e in merged.ranks[0].events]
    assert states == [(1, EventState.RETURNED, False), (2, EventState.RETURNED, False),
                      (3, EventState.ENTERED, True), (4, EventState.RETURNED, False)]
    assert not any(e.in_flight for e in merged.ranks[1].events)
    root = analyze(merged).root_cause
    assert root.kind is FindingKind.MISSING_COLLECTIVE and root.ranks == (1,) and root.seq == 3
    assert root.evidence["waiting_states"] == {"0": "in_flight"}
    assert "never completed (Flight Recorder)" in root.detail


def test_a_slow_collective_in_flight_is_not_a_deadlock_with_a_rank_one_call_behind(tb) -> None:
    """NCCL, healthy: both ranks' all_reduce #2 still runs on the GPU; rank 0's CPU has already
    queued #3, rank 1's has not (it waits on its stream). Everyone is in #2: slow, not stuck."""
    from nccl_doctor.analysis.calls.situation import Situation, assess

    rank0 = [tb.event(i, seq=i, input="float32[36]") for i in (1, 2, 3)]
    rank1 = [tb.event(i, seq=i, input="float32[36]") for i in (1, 2)]
    traces = tb.traceset([tb.trace(0, rank0, tb.RUNNING), tb.trace(1, rank1, tb.RUNNING)],
                         groups={"0": (0, 1)})
    dumps = {0: {"entries": [nccl(0, 1, "completed", True), nccl(1, 2, "started", False),
                             nccl(2, 3, "scheduled", False)]},
             1: {"entries": [nccl(0, 1, "completed", True), nccl(1, 2, "started", False)]}}
    merged = merge(traces, dumps)
    a = assess(merged, analyze(merged), {})
    assert {r: e.seq for r, e in a.waiting.items()} == {0: 2, 1: 2}
    assert a.situation is Situation.ALL_WAITING and a.cause is None
    # the same ranks, but rank 1 is blocked (in Python) in a barrier at #2: that cannot complete
    rank1 = [tb.event(1, seq=1, input="float32[36]"),
             tb.event(2, "barrier", seq=2, input="", state=tb.ENTERED)]
    traces = tb.traceset([tb.trace(0, rank0, tb.RUNNING), tb.trace(1, rank1, tb.RUNNING)],
                         groups={"0": (0, 1)})
    merged = merge(traces, {0: dumps[0]})
    a = assess(merged, analyze(merged), {})
    assert a.situation is Situation.DEADLOCK and a.cause.seq == 2, a


def test_kernel_start_and_completion_are_read_only_together() -> None:
    """With TORCH_NCCL_ENABLE_TIMING=1 an entry has both; without it (the H100 fixtures' dumps)
    only the completion, which says nothing of the time inside the collective."""
    timed = {**nccl(0, 1, "completed", True), "time_discovered_started_ns": T0 + 10,
             "time_discovered_completed_ns": T0 + 5_000}
    untimed = {**nccl(1, 2, "completed", True), "time_discovered_started_ns": None,
               "time_discovered_completed_ns": T0 + 9_000}
    first, second = events_from_dump({"entries": [timed, untimed]})
    assert (first.t_gpu_start_ns, first.t_gpu_end_ns) == (T0 + 10, T0 + 5_000)
    assert (second.t_gpu_start_ns, second.t_gpu_end_ns) == (None, None)


def test_the_kernels_own_duration_wins_over_the_discovered_completion() -> None:
    timed = {**nccl(0, 1, "completed", True), "time_discovered_started_ns": T0 + 10,
             "time_discovered_completed_ns": T0 + 90_000_000, "duration_ms": 2.5}
    (e,) = events_from_dump({"entries": [timed]})
    assert e.t_gpu_end_ns == T0 + 10 + 2_500_000
