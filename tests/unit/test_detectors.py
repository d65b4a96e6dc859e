"""The analysis passes, one at a time and together, on synthetic TraceSets."""

from __future__ import annotations

import pytest

from nccl_doctor.analysis import PASSES, analyze
from nccl_doctor.analysis.calls.align import leaf_collectives, timelines
from nccl_doctor.analysis.what.exited import detect_rank_exited
from nccl_doctor.analysis.what.mismatch import detect_collective_mismatch
from nccl_doctor.analysis.what.missing import detect_missing_collective
from nccl_doctor.diagnosis import FindingKind, Severity, Verdict
from nccl_doctor.model import (
    Location, EventFlag, EventKind, EventState, ExitKind, RankExit, Unrecorded,
)

RETURNED, ENTERED, FAILED, ISSUED = (
    EventState.RETURNED, EventState.ENTERED, EventState.FAILED, EventState.ISSUED,
)


def all_passes(ts):
    return {p.__name__: p(ts) for p in PASSES}


def titles(ts):
    """Every pass's findings, as (pass, kind, title): readable in an assertion failure."""
    return [(name, f.kind.value, f.title) for name, fs in all_passes(ts).items() for f in fs]


def two_ranks(tb, ev0, ev1, exits=(None, None)):
    """A 2-rank TraceSet whose ranks made calls ``ev0`` and ``ev1`` (still running by default)."""
    return tb.traceset([tb.trace(0, ev0, exits[0]), tb.trace(1, ev1, exits[1])])


# -- nothing to report ---------------------------------------------------------------------------

def test_empty_traceset(tb) -> None:
    ts = tb.traceset([], world_size=0)
    for name, findings in all_passes(ts).items():
        assert findings == [], name
    d = analyze(ts)
    assert d.verdict is Verdict.NOT_RECORDED  # nothing known is never "ok"
    assert d.findings == () and d.root_cause is None and d.ranks == ()
    assert any("no rank joined a process group" in n and "Ray cluster" in n for n in d.notes)


def test_single_rank(tb) -> None:
    ts = tb.traceset([tb.trace(0, tb.collectives(6, group_size=1), tb.clean(), world_size=1)])
    for name, findings in all_passes(ts).items():
        assert findings == [], name
    d = analyze(ts)
    assert d.verdict is Verdict.OK and d.findings == ()
    assert [r.state for r in d.ranks] == ["exited"]


def test_single_rank_still_running(tb) -> None:
    ts = tb.traceset([tb.trace(0, tb.collectives(3, group_size=1, last_state=ENTERED),
                               world_size=1)])
    assert titles(ts) == []
    assert analyze(ts).findings == ()


def test_clean_run(tb) -> None:
    ts = tb.scenarios["clean"]()
    assert titles(ts) == []
    d = analyze(ts)
    assert d.verdict is Verdict.OK and d.findings == ()
    assert [(r.rank, r.state, r.exit_code) for r in d.ranks] == [(0, "exited", 0), (1, "exited", 0)]
    assert d.ranks[0].last_collective.seq == 5


# -- collective_mismatch -------------------------------------------------------------------------

def test_shape_mismatch_two_ranks(tb) -> None:
    ts = tb.scenarios["shape_mismatch"]()
    (f,) = detect_collective_mismatch(ts)
    assert f.kind is FindingKind.COLLECTIVE_MISMATCH and f.severity is Severity.ERROR
    assert f.evidence["aspect"] == "shape"
    assert f.evidence["majority"] is None
    # no majority: the side that differs from the lowest rank is named (PyTorch's convention)
    assert f.ranks == (1,) and "differing from rank 0, the lowest rank" in f.detail
    assert f.group == "0" and f.seq == 3 and f.op == "all_gather"
    assert "float32[2,7,32]" in f.title and "float32[2,9,32]" in f.title
    assert "shapes differ" in f.title
    assert "pad" in f.hint
    assert f.callsite == "/job/train.py:40"
    sides = f.evidence["sides"]
    assert [s["ranks"] for s in sides] == [[0], [1]]
    assert [s["state"] for s in sides] == ["failed", "failed"]


def test_shape_mismatch_four_ranks_one_odd(tb) -> None:
    traces = []
    for rank in range(4):
        shape = "float32[2,9,32]" if rank == 2 else "float32[2,7,32]"
        events = tb.collectives(2, group_size=4) + [
            tb.event(3, "all_gather", input=shape, group_size=4, state=ENTERED),
        ]
        traces.append(tb.trace(rank, events, world_size=4))
    (f,) = detect_collective_mismatch(tb.traceset(traces))
    assert f.evidence["aspect"] == "shape"
    assert f.ranks == (2,)
    assert f.evidence["majority"] == [0, 1, 3]
    assert "rank 2: float32[2,9,32]" in f.title and "ranks 0, 1, 3: float32[2,7,32]" in f.title
    assert "disagrees with the majority" in f.detail


def test_op_mismatch(tb) -> None:
    ev0 = tb.collectives(2) + [tb.event(3, "all_reduce", state=ENTERED)]
    ev1 = tb.collectives(2) + [tb.event(3, "broadcast", peer=0, state=ENTERED)]
    (f,) = detect_collective_mismatch(two_ranks(tb, ev0, ev1))
    assert f.evidence["aspect"] == "op"
    assert f.seq == 3 and f.ranks == (1,)
    assert "all_reduce / broadcast #3" in f.title and "ops differ" in f.title


def test_no_majority_names_the_rank_that_skipped_a_call(tb) -> None:
    """Two ranks, ops differ at #3: the rank whose call #3 is its peer's next call (#4) skipped
    the peer's #3 - whichever rank that is, the lowest included."""
    bcast = tb.event(3, "broadcast", peer=0, state=RETURNED, line=14)
    for skipper in (0, 1):
        skipped = tb.collectives(2) + [tb.event(3, "all_reduce", state=ENTERED, line=20)]
        full = tb.collectives(2) + [bcast, tb.event(4, "all_reduce", state=ENTERED, line=20)]
        ev = {skipper: skipped, 1 - skipper: full}
        (f,) = detect_collective_mismatch(two_ranks(tb, ev[0], ev[1]))
        assert f.ranks == (skipper,), f.detail
        assert f"rank {skipper} skipped broadcast" in f.detail


def test_dtype_mismatch(tb) -> None:
    ev0 = [tb.event(1, "all_reduce", input="float32[1024]")]
    ev1 = [tb.event(1, "all_reduce", input="bfloat16[1024]")]
    (f,) = detect_collective_mismatch(two_ranks(tb, ev0, ev1))
    assert f.evidence["aspect"] == "dtype"
    assert "dtypes differ" in f.title
    assert "float32[1024]" in f.title and "bfloat16[1024]" in f.title


def test_root_mismatch_on_broadcast(tb) -> None:
    ev0 = [tb.event(1, "broadcast", input="float32[8]", peer=0)]
    ev1 = [tb.event(1, "broadcast", input="float32[8]", peer=1)]
    (f,) = detect_collective_mismatch(two_ranks(tb, ev0, ev1))
    assert f.evidence["aspect"] == "root"
    assert "root 0" in f.title and "root 1" in f.title


def test_group_size_mismatch(tb) -> None:
    ev0 = [tb.event(1, group_size=2)]
    ev1 = [tb.event(1, group_size=3)]
    (f,) = detect_collective_mismatch(two_ranks(tb, ev0, ev1))
    assert f.evidence["aspect"] == "group_size"


def test_peer_of_an_unrooted_collective_is_not_compared(tb) -> None:
    ev0 = [tb.event(1, "all_reduce", peer=-1)]
    ev1 = [tb.event(1, "all_reduce", peer=1)]
    assert detect_collective_mismatch(two_ranks(tb, ev0, ev1)) == []


def test_aliases_are_one_op(tb) -> None:
    ev0 = [tb.event(1, "_all_gather_base", input="float32[4]")]
    ev1 = [tb.event(1, "all_gather_into_tensor", input="float32[4]")]
    assert detect_collective_mismatch(two_ranks(tb, ev0, ev1)) == []


def test_scatter_compares_outputs_not_inputs(tb) -> None:
    # the scatter list exists on the root only: inputs differ by design
    ev0 = [tb.event(1, "scatter", input="2*float32[4]", output="float32[4]", peer=0)]
    ev1 = [tb.event(1, "scatter", input="", output="float32[4]", peer=0)]
    assert detect_collective_mismatch(two_ranks(tb, ev0, ev1)) == []
    ev1 = [tb.event(1, "scatter", input="", output="float32[5]", peer=0)]
    (f,) = detect_collective_mismatch(two_ranks(tb, ev0, ev1))
    assert f.evidence["aspect"] == "shape"


def test_only_the_first_divergence_of_a_group_is_reported(tb) -> None:
    ev0 = tb.collectives(6)
    ev1 = tb.collectives(6)
    ev1[2] = tb.event(3, input="float32[5]")
    ev1[4] = tb.event(5, "broadcast", peer=0)
    (f,) = detect_collective_mismatch(two_ranks(tb, ev0, ev1))
    assert f.seq == 3 and f.evidence["aspect"] == "shape"


def test_first_divergence_is_per_group(tb) -> None:
    ev0 = [tb.event(1), tb.event(2, group="7", seq=1)]
    ev1 = [tb.event(1, input="float32[5]"), tb.event(2, group="7", seq=1, input="int64[4]")]
    findings = detect_collective_mismatch(
        tb.traceset([tb.trace(0, ev0), tb.trace(1, ev1)], groups={"0": (0, 1), "7": (0, 1)})
    )
    assert sorted((f.group, f.seq, f.evidence["aspect"]) for f in findings) == [
        ("0", 1, "shape"), ("7", 1, "dtype"),
    ]


def test_composite_events_are_not_compared(tb) -> None:
    # rank 0 calls all_gather_object (one composite record wrapping two all_gathers); rank 1
    # issues the same two all_gathers by hand. On the wire they are the same calls.
    composite = tb.event(1, "all_gather_object", seq=1, input="", flags=EventFlag.COMPOSITE,
                         seq_delta=2)
    ev0 = [
        composite,
        tb.event(2, "all_gather", seq=1, input="int64[1]", parent=1),
        tb.event(3, "all_gather", seq=2, input="uint8[100]", parent=1),
    ]
    ev1 = [
        tb.event(1, "all_gather", seq=1, input="int64[1]"),
        tb.event(2, "all_gather", seq=2, input="uint8[100]"),
    ]
    ts = two_ranks(tb, ev0, ev1)
    assert [e.idx for e in leaf_collectives(ts.ranks[0])] == [2, 3]
    assert titles(ts) == []


def test_a_parent_is_not_compared_even_without_the_composite_flag(tb) -> None:
    ev0 = [
        tb.event(1, "all_gather_object", seq=1, input="", seq_delta=2),
        tb.event(2, "all_gather", seq=1, input="int64[1]", parent=1),
        tb.event(3, "all_gather", seq=2, input="uint8[100]", parent=1),
    ]
    ev1 = [
        tb.event(1, "all_gather", seq=1, input="int64[1]"),
        tb.event(2, "all_gather", seq=2, input="uint8[100]"),
    ]
    assert titles(two_ranks(tb, ev0, ev1)) == []


def test_children_of_a_composite_are_compared(tb) -> None:
    ev = lambda n: [  # noqa: E731
        tb.event(1, "all_gather_object", seq=1, input="", flags=EventFlag.COMPOSITE, seq_delta=2),
        tb.event(2, "all_gather", seq=1, input="int64[1]", parent=1),
        tb.event(3, "all_gather", seq=2, input=f"uint8[{n}]", parent=1),
    ]
    (f,) = detect_collective_mismatch(two_ranks(tb, ev(100), ev(120)))
    assert f.seq == 2 and f.op == "all_gather" and f.evidence["aspect"] == "shape"


def test_async_collective_waited_on_is_still_compared(tb) -> None:
    """all_reduce(async_op=True) then work.wait(): the WAIT record's parent is the collective.
    The collective is a leaf all the same, and a shape mismatch in it must be found."""
    def ranks_calls(n):
        return [
            tb.event(1, "all_reduce", input=f"float32[{n}]", state=ISSUED,
                     flags=EventFlag.ASYNC),
            tb.event(2, "wait", kind=EventKind.WAIT, seq=1, input=f"float32[{n}]", parent=1,
                     state=ENTERED),
        ]
    (f,) = detect_collective_mismatch(two_ranks(tb, ranks_calls(4), ranks_calls(8)))
    assert f.seq == 1 and f.evidence["aspect"] == "shape"


def test_async_collective_waited_on_aligns_with_a_sync_one(tb) -> None:
    """Rank 0 runs collective #3 async and waits on it; rank 1 runs it synchronously. Same
    collective: nothing is missing."""
    ev0 = tb.collectives(2) + [
        tb.event(3, "all_reduce", state=ISSUED, flags=EventFlag.ASYNC),
        tb.event(4, "wait", kind=EventKind.WAIT, seq=3, parent=3, seq_delta=0),
    ]
    ev1 = tb.collectives(3)
    ts = two_ranks(tb, ev0, ev1, exits=(tb.clean(), tb.clean()))
    assert titles(ts) == []
    d = analyze(ts)
    assert d.verdict is Verdict.OK
    assert d.ranks[0].last_collective.seq == 3


def test_seq_offset_aligns_ranks_whose_p2p_bumped_the_sequence(tb) -> None:
    # ranks 0 and 1 exchanged a send/recv (PyTorch bumps their sequence number, not rank 2's);
    # then every rank calls all_reduce: seq 2 on ranks 0-1, seq 1 on rank 2.
    def with_p2p(rank):
        return [
            tb.event(1, "send" if rank == 0 else "recv", kind=EventKind.P2P, seq=1,
                     peer=1 - rank, group_size=3),
            tb.event(2, "all_reduce", seq=2, seq_offset=1, group_size=3),
            tb.event(3, "all_reduce", seq=3, seq_offset=1, group_size=3, state=ENTERED),
        ]
    plain = [tb.event(1, group_size=3), tb.event(2, group_size=3, state=ENTERED)]
    ts = tb.traceset([
        tb.trace(0, with_p2p(0), world_size=3), tb.trace(1, with_p2p(1), world_size=3),
        tb.trace(2, plain, world_size=3),
    ])
    tl = timelines(ts)["0"]
    assert tl.seqs() == [1, 2]
    assert sorted(tl.calls[1]) == [0, 1, 2] and sorted(tl.calls[2]) == [0, 1, 2]
    assert tl.last_seq == {0: 2, 1: 2, 2: 2}
    assert titles(ts) == []


def test_seq_offset_alignment_still_finds_a_mismatch(tb) -> None:
    ev0 = [tb.event(1, "send", kind=EventKind.P2P, seq=1, peer=1),
           tb.event(2, "all_reduce", seq=2, seq_offset=1, input="float32[3]")]
    ev1 = [tb.event(1, "all_reduce", seq=1, input="float32[4]")]
    (f,) = detect_collective_mismatch(two_ranks(tb, ev0, ev1))
    assert f.seq == 1 and f.evidence["aspect"] == "shape"


def test_calls_that_did_not_advance_the_sequence_are_ignored(tb) -> None:
    # seq_delta == 0: a call issued inside a coalescing manager, numbered by the manager
    ev0 = tb.collectives(2) + [tb.event(3, "broadcast", seq=3, seq_delta=0, peer=0)]
    ev1 = tb.collectives(2)
    assert titles(two_ranks(tb, ev0, ev1)) == []


# -- missing_collective --------------------------------------------------------------------------

def test_missing_collective_rank_exited(tb) -> None:
    ts = tb.scenarios["rank_exited_early"]()
    (f,) = detect_missing_collective(ts)
    assert f.kind is FindingKind.MISSING_COLLECTIVE and f.severity is Severity.ERROR
    assert f.ranks == (1,) and f.group == "0" and f.seq == 5 and f.op == "all_reduce"
    assert "ranks 0, 2, 3 entered it" in f.title and "rank 1 never did" in f.title
    assert "exited" in f.detail
    assert "rank 1 exited cleanly" in f.detail
    assert f.evidence["waiting_ranks"] == [0, 2, 3] and f.evidence["missing_ranks"] == [1]
    assert f.evidence["instead"]["1"]["category"] == "exited"
    assert f.evidence["waiting_states"] == {"0": "failed", "2": "failed", "3": "failed"}
    assert "same number of steps" in f.hint


def test_missing_collective_rank_blocked_elsewhere(tb) -> None:
    ts = tb.scenarios["hang_missing"]()
    (f,) = detect_missing_collective(ts)
    assert f.ranks == (1,) and f.seq == 4
    assert f.evidence["instead"]["1"]["category"] == "blocked"
    assert "blocked" in f.detail and "barrier #1 (group 1)" in f.detail
    assert "ranks 0, 2 entered it" in f.title


def test_missing_collective_rank_outside_any_collective(tb) -> None:
    ts = two_ranks(tb, tb.collectives(3, last_state=ENTERED), tb.collectives(2))
    (f,) = detect_missing_collective(ts)
    assert f.ranks == (1,) and f.seq == 3
    assert f.evidence["instead"]["1"]["category"] == "elsewhere"
    assert "outside any collective" in f.detail


def test_missing_collective_rank_without_capture(tb) -> None:
    ts = tb.scenarios["no_capture"]()
    (f,) = detect_missing_collective(ts)
    assert f.ranks == (2,) and f.seq == 1
    assert f.evidence["instead"]["2"]["category"] == "no_capture"
    assert "no capture" in f.detail


def test_missing_collective_skips_a_gap_left_by_the_ring(tb) -> None:
    # rank 1's capture lost its oldest records; rank 0 was lapped differently: the first seq
    # both have is 5
    ev0 = [tb.event(i) for i in range(5, 9)]
    ev1 = [tb.event(i) for i in range(2, 4)]  # rank 1 stopped after #3
    (f,) = detect_missing_collective(two_ranks(tb, ev0, ev1))
    assert f.seq == 5 and f.ranks == (1,)


def test_all_ranks_at_the_same_point_is_not_missing(tb) -> None:
    ts = two_ranks(tb, tb.collectives(4, last_state=ENTERED), tb.collectives(4, last_state=ENTERED))
    assert detect_missing_collective(ts) == []


# -- rank_exited ---------------------------------------------------------------------------------

def test_rank_exited_cleanly_while_peers_went_on(tb) -> None:
    ts = tb.scenarios["rank_exited_early"]()
    (f,) = detect_rank_exited(ts)
    assert f.kind is FindingKind.RANK_EXITED and f.severity is Severity.ERROR
    assert f.ranks == (1,)
    assert "rank 1 exited cleanly" in f.title and "peers still needed it" in f.title
    assert f.evidence["needed_in"] == [{"group": "0", "seq": 5}]
    assert f.evidence["exit"] == "exit"
    assert "same number of steps" in f.hint
    assert f.seq == 4 and f.op == "all_reduce"


def test_rank_exited_is_the_root_cause(tb) -> None:
    ts = tb.scenarios["rank_exited_early"]()
    d = analyze(ts)
    root = d.root_cause
    assert root is not None and d.findings[0] is root
    assert root.kind is FindingKind.RANK_EXITED and root.ranks == (1,)
    assert sum(f.root_cause for f in d.findings) == 1
    kinds = sorted(f.kind.value for f in d.findings)
    assert kinds == ["missing_collective", "rank_exited"]  # the peers' exceptions are no finding
    consequences = root.evidence["consequences"]
    assert [c["rank"] for c in consequences] == [0, 2, 3]
    assert all(c["exit"] == "exception" for c in consequences)
    assert "consequences, not causes" in root.detail
    assert "Timed out" in root.detail
    assert d.verdict is Verdict.CRASH


def test_rank_exited_root_cause_when_peers_hang(tb) -> None:
    traces = [tb.trace(r, tb.collectives(5, last_state=ENTERED, group_size=3), world_size=3)
              for r in (0, 2)]
    traces.append(tb.trace(1, tb.collectives(3, group_size=3), tb.clean(tb.T0 + 4 * tb.STEP),
                           world_size=3))
    d = analyze(tb.traceset(traces))
    assert d.verdict is Verdict.HANG
    assert d.root_cause.kind is FindingKind.RANK_EXITED and d.root_cause.ranks == (1,)
    (missing,) = [f for f in d.findings if f.kind is FindingKind.MISSING_COLLECTIVE]
    assert missing.seq == 4 and not missing.root_cause


def test_rank_died_by_exception_outside_collectives(tb) -> None:
    site = Location("/job/data.py", 88, "load")
    ts = two_ranks(
        tb, tb.collectives(3), tb.collectives(3),
        exits=(tb.clean(), tb.raised("KeyError: 'label'", site, tb.T0 + 9 * tb.STEP)),
    )
    (f,) = detect_rank_exited(ts)
    assert f.ranks == (1,)
    assert "raised KeyError: 'label'" in f.title and "/job/data.py:88" in f.title
    assert "peers still needed it" not in f.title
    assert f.callsite == "/job/data.py:88"
    assert f.evidence["exit"] == "exception" and f.evidence["needed_in"] == []
    assert "Fix the error" in f.hint
    d = analyze(ts)
    assert d.root_cause.kind is FindingKind.RANK_EXITED
    assert "consequences" not in d.root_cause.evidence  # its own exit is no consequence
    assert d.verdict is Verdict.CRASH


def test_ranks_with_the_same_fate_share_one_finding(tb) -> None:
    traces = [tb.trace(r, tb.collectives(2, group_size=3), tb.clean(), world_size=3)
              for r in (1, 2)]
    traces.append(tb.trace(0, tb.collectives(4, group_size=3, last_state=ENTERED), world_size=3))
    (f,) = detect_rank_exited(tb.traceset(traces))
    assert f.ranks == (1, 2) and "ranks 1, 2 exited cleanly" in f.title


def test_clean_exit_nobody_waited_for_is_no_finding(tb) -> None:
    ts = two_ranks(tb, tb.collectives(3), tb.collectives(3), exits=(tb.clean(), tb.RUNNING))
    assert detect_rank_exited(ts) == []


def test_death_inside_a_mismatched_collective(tb) -> None:
    ts = tb.scenarios["shape_mismatch"]()
    assert detect_rank_exited(ts) == []
    assert detect_missing_collective(ts) == []
    d = analyze(ts)
    assert [f.kind for f in d.findings] == [FindingKind.COLLECTIVE_MISMATCH]
    root = d.root_cause
    assert root is d.findings[0] and root.evidence["aspect"] == "shape"
    assert [c["rank"] for c in root.evidence["consequences"]] == [0, 1]
    assert all(c["exit"] == "exception" for c in root.evidence["consequences"])
    assert "all_gather #3" in root.evidence["consequences"][0]["detail"]
    assert d.verdict is Verdict.CRASH


def test_signal_inside_a_collective_is_no_rank_exited(tb) -> None:
    killed = RankExit(ExitKind.SIGNAL, signal="SIGABRT")
    ts = two_ranks(tb, tb.collectives(3, last_state=ENTERED), tb.collectives(3, last_state=ENTERED),
                   exits=(killed, tb.RUNNING))
    assert detect_rank_exited(ts) == []
    d = analyze(ts)
    assert d.verdict is Verdict.CRASH
    assert [r.state for r in d.ranks] == ["signal", "blocked"]
    assert d.ranks[0].signal == "SIGABRT"


# -- verdicts and summaries ----------------------------------------------------------------------

def test_verdict_ok_on_clean_exits(tb) -> None:
    assert analyze(tb.scenarios["clean"]()).verdict is Verdict.OK


def test_verdict_crash_on_abnormal_exit(tb) -> None:
    vanished = RankExit(ExitKind.VANISHED)
    ts = two_ranks(tb, tb.collectives(3, last_state=ENTERED), tb.collectives(3, last_state=ENTERED),
                   exits=(vanished, tb.clean()))
    assert analyze(ts).verdict is Verdict.CRASH


def test_a_rank_that_vanished_inside_a_mismatched_collective_is_its_consequence(tb) -> None:
    """The padded all_gather on gloo: rank 0 aborts on the size check (SIGABRT) and torchrun's
    SIGTERM ends rank 1, still inside that all_gather, with no exit record. The mismatch is the
    root cause, rank 1's end one of its consequences - not a finding of its own."""
    def ranks_events(length: int) -> list:
        return tb.collectives(2) + [tb.event(3, "all_gather", input=f"float32[2,{length},32]",
                                             state=ENTERED)]
    aborted = RankExit(ExitKind.SIGNAL, signal="SIGABRT", time_ns=tb.T0 + 50 * tb.STEP)
    d = analyze(two_ranks(tb, ranks_events(7), ranks_events(9),
                          exits=(aborted, RankExit(ExitKind.VANISHED))))
    assert d.verdict is Verdict.CRASH
    assert d.root_cause.kind is FindingKind.COLLECTIVE_MISMATCH and d.root_cause.seq == 3
    assert [f.kind for f in d.findings] == [FindingKind.COLLECTIVE_MISMATCH]
    assert {c["rank"]: c["exit"] for c in d.root_cause.evidence["consequences"]} == {
        0: "signal", 1: "vanished"}
    # vanishing in another collective than the mismatched one is still a finding of its own
    def went_on(length: int) -> list:
        return tb.collectives(2) + [tb.event(3, "all_gather", input=f"float32[2,{length},32]"),
                                    tb.event(4, state=ENTERED)]
    d = analyze(two_ranks(tb, went_on(7), went_on(9),
                          exits=(aborted, RankExit(ExitKind.VANISHED))))
    assert d.root_cause.kind is FindingKind.COLLECTIVE_MISMATCH and d.root_cause.seq == 3
    exited = [f for f in d.findings if f.kind is FindingKind.RANK_EXITED]
    assert [(f.ranks, f.seq) for f in exited] == [((1,), 4)]


def test_verdict_crash_on_failed_exit_status(tb) -> None:
    ts = tb.scenarios["clean"]()
    ts = tb.traceset(list(ts.ranks.values()), exit_status=1)
    assert analyze(ts).verdict is Verdict.CRASH


def test_verdict_hang_on_desync_with_a_running_rank(tb) -> None:
    d = analyze(tb.scenarios["hang_missing"]())
    assert d.verdict is Verdict.HANG
    assert d.root_cause.kind is FindingKind.MISSING_COLLECTIVE
    assert [r.state for r in d.ranks] == ["blocked", "blocked", "blocked"]


def test_verdict_hang_on_mismatch_with_running_ranks(tb) -> None:
    ev0 = tb.collectives(2) + [tb.event(3, input="float32[3]", state=ENTERED)]
    ev1 = tb.collectives(2) + [tb.event(3, input="float32[4]", state=ENTERED)]
    d = analyze(two_ranks(tb, ev0, ev1))
    assert d.verdict is Verdict.HANG
    assert d.root_cause.kind is FindingKind.COLLECTIVE_MISMATCH


def test_summaries_include_ranks_without_capture(tb) -> None:
    d = analyze(tb.scenarios["no_capture"]())
    assert [(r.rank, r.state) for r in d.ranks] == [(0, "blocked"), (1, "blocked"),
                                                      (2, "no_capture")]
    assert d.ranks[2].last_collective is None and d.ranks[2].exit_detail == "left no capture"
    assert d.groups == {"0": (0, 1, 2)}


def test_root_cause_is_the_earliest_unexplained_error(tb) -> None:
    # group 0 diverges at t=3 ms, group 1 at t=1 ms (its collective was entered earlier)
    ev0 = [tb.event(1, group="1", seq=1, input="float32[2]", t_enter_ns=tb.T0 + 1),
           tb.event(2, group="0", seq=1, input="float32[2]", t_enter_ns=tb.T0 + 3)]
    ev1 = [tb.event(1, group="1", seq=1, input="int32[2]", t_enter_ns=tb.T0 + 2),
           tb.event(2, group="0", seq=1, input="float32[9]", t_enter_ns=tb.T0 + 4)]
    ts = tb.traceset([tb.trace(0, ev0, tb.clean()), tb.trace(1, ev1, tb.clean())],
                     groups={"0": (0, 1), "1": (0, 1)})
    d = analyze(ts)
    assert len(d.findings) == 2
    assert d.root_cause.group == "1" and d.findings[0] is d.root_cause


def test_incomplete_capture_problems_become_notes(tb) -> None:
    ts = tb.traceset([tb.trace(0, tb.collectives(1), tb.clean())],
                     problems=("rank 0's capture is incomplete (file truncated)",))
    d = analyze(ts)
    assert d.notes == ("rank 0's capture is incomplete (file truncated)",)


@pytest.mark.parametrize("name", ["empty", "clean", "shape_mismatch", "rank_exited_early",
                                  "hang_missing", "no_capture"])
def test_passes_are_pure(tb, name) -> None:
    ts = tb.scenarios[name]()
    assert all_passes(ts) == all_passes(ts)


def _late(tb, late_rank: int | None, skew_ms: float, n: int = 6, ranks: int = 3, samples=()):
    from dataclasses import replace

    from nccl_doctor.analysis.slow.straggler import detect_straggler

    traces = []
    for r in range(ranks):
        events = []
        for i in range(1, n + 1):
            late = late_rank if late_rank is not None else i % ranks  # None: turns
            offset = int(skew_ms * 1e6) if r == late else 0
            events.append(tb.event(i, t_enter_ns=tb.T0 + i * 10**9 + offset, group_size=ranks))
        traces.append(tb.trace(r, events, tb.clean(), world_size=ranks))
    return detect_straggler(replace(tb.traceset(traces), stack_samples=tuple(samples)))


def test_straggler_is_the_rank_consistently_last(tb):
    (f,) = _late(tb, 2, skew_ms=150)
    assert f.kind is FindingKind.STRAGGLER and f.severity is Severity.WARNING
    assert f.ranks == (2,) and f.evidence["last"] == {"2": 6}
    assert f.evidence["median_ms"] == 150 and "/job/train.py" in f.detail
    assert _late(tb, None, skew_ms=150) == []  # each rank late in turn: nobody consistently
    assert _late(tb, 2, skew_ms=5) == []  # 5 ms: noise
    assert _late(tb, 2, skew_ms=150, n=4) == []  # too few collectives to say
    assert f.evidence["doing"] == {}
    # 6 of 6 on 3 ranks happens by chance 1 time in 729; what carries it is the size: 150 ms
    # when nobody else is ever late by 20 ms (the noise floor)
    assert f.evidence["noise_ms"] == {"2": 20.0} and "about 1 in 729" in f.detail
    assert _late(tb, 2, skew_ms=60) == []  # 60 ms, 6 times: 3x the floor, and chance allows it
    (f,) = _late(tb, 2, skew_ms=60, n=8)  # 8 of 8: 1 in 6,561
    assert f.evidence["chance"]["2"] < 1e-3


def test_a_loaded_host_shuffling_arrival_order_is_not_a_straggler(tb):
    """What CI's 2 cores did to 4 healthy ranks: skews of 20-190 ms in 5 of 22 collectives, rank 2
    last in 3 of them. Some rank of 4 is last in 3 of 5 four times in ten by chance alone."""
    from nccl_doctor.analysis.slow.straggler import chance_of, detect_straggler

    late_ms = {3: (2, 35), 7: (0, 60), 11: (2, 185), 15: (1, 30), 19: (2, 25)}  # seq: rank, ms
    traces = []
    for r in range(4):
        events = []
        for i in range(1, 23):
            who, ms = late_ms.get(i, (i % 4, 3))
            offset = int(ms * 1e6) if r == who else 0
            events.append(tb.event(i, t_enter_ns=tb.T0 + i * 10**9 + offset, group_size=4))
        traces.append(tb.trace(r, events, tb.clean(), world_size=4))
    assert detect_straggler(tb.traceset(traces)) == []
    assert chance_of(3, 5, 0.25) == pytest.approx(0.1035, abs=1e-4)
    assert chance_of(5, 5, 0.5) == pytest.approx(1 / 32)
    assert chance_of(0, 5, 0.5) == 1.0


def test_lateness_in_one_step_is_a_burst_not_a_straggler(tb):
    """What CI's loaded 2 cores did to a healthy FSDP job: one rank late at every collective of
    one step (its warm-up, or a stretch without a CPU) - six collectives, but one event. The same
    lateness spread over two steps is consistent."""
    from nccl_doctor.analysis.slow.straggler import detect_straggler

    def job(late_steps):  # 3 steps of 6 calls from one line, 10 s apart; rank 2 late 300 ms
        traces = []
        for r in range(3):
            events = []
            for step in range(3):
                for k in range(6):
                    i = step * 6 + k + 1
                    offset = int(300e6) if r == 2 and (step, k) in late_steps else 0
                    t = tb.T0 + step * 10 * 10**9 + k * 10**9 + offset
                    events.append(tb.event(i, t_enter_ns=t, group_size=3))
            traces.append(tb.trace(r, events, tb.clean(), world_size=3))
        return detect_straggler(tb.traceset(traces))

    assert job({(1, k) for k in range(6)}) == []
    (f,) = job({(0, k) for k in range(3)} | {(2, k) for k in range(3)})
    assert f.ranks == (2,) and f.evidence["last"] == {"2": 6}


def test_straggler_says_where_its_stack_samples_found_it(tb):
    from nccl_doctor.stacks.samples import StackSample

    def at(rank, *frames):
        return StackSample(1.0, rank, frames, (0, 1), "py-spy")

    samples = [at(2, "train.py:40 in load_batch", "train.py:90 in main")] * 3 + [
        at(2, "train.py:12 in log_metrics"), at(1, "train.py:40 in load_batch"), at(2)]
    (f,) = _late(tb, 2, skew_ms=150, samples=samples)
    assert f.evidence["doing"] == {"2": [
        {"frame": "train.py:40 in load_batch", "samples": 3, "of": 4,
         "stack": ["train.py:40 in load_batch", "train.py:90 in main"]},
        {"frame": "train.py:12 in log_metrics", "samples": 1, "of": 4,
         "stack": ["train.py:12 in log_metrics"]}]}
    assert ("While its peers waited, rank 2 was at train.py:40 in load_batch (3 of 4 stack "
            "samples); train.py:12 in log_metrics (1 of 4 stack samples)") in f.detail


def test_a_late_rank_is_waited_for_by_peers_that_entered_a_collective_it_has_not(tb):
    from nccl_doctor.supervisor.straggler_watch import waited_by

    ahead = [tb.event(i, seq=i, group_size=3) for i in (1, 2, 3)]  # returned: NCCL-like
    behind = [tb.event(i, seq=i, group_size=3) for i in (1, 2)]
    traces = tb.traceset([tb.trace(0, ahead, world_size=3), tb.trace(1, ahead, world_size=3),
                          tb.trace(2, behind, world_size=3)])
    assert waited_by(traces, 2) == (0, 1) and waited_by(traces, 0) == ()
    inside = behind + [tb.event(3, "barrier", seq=3, input="", state=tb.ENTERED, group_size=3)]
    traces = tb.traceset([tb.trace(0, ahead, world_size=3), tb.trace(2, inside, world_size=3)],
                         groups={"0": (0, 2)})
    assert waited_by(traces, 2) == ()  # inside a collective itself: not what the watch samples


def test_a_rank_that_could_not_be_recorded_is_not_missing(tb) -> None:
    """World of 3; rank 2's recorder could not make its capture (capture/unrecorded.py): it ran
    unseen. Ranks 0 and 1 ran 3 collectives and exited cleanly: nothing is wrong that is known,
    and the note says what is not seen. Without the marker the same captures blame rank 2."""
    from dataclasses import replace
    end = tb.clean(tb.T0 + 9 * tb.STEP)
    traces = tb.traceset([tb.trace(r, tb.collectives(3, group_size=3), end, world_size=3)
                          for r in (0, 1)],
                         groups={"0": (0, 1, 2)}, world_size=3)
    blamed = analyze(traces, annotators=())
    assert blamed.root_cause is not None and blamed.root_cause.ranks == (2,)
    why = "cannot create its capture in /out (No space left on device)"
    d = analyze(replace(traces, unrecorded={2: Unrecorded(why, "node1")}), annotators=())
    assert d.verdict is Verdict.OK and d.findings == ()
    assert [(r.exit_detail, r.host) for r in d.ranks if r.rank == 2] == [
        ("not recorded (see the note)", "node1")]
    assert any(n.startswith(f"rank 2 on node1 was not recorded: {why}") for n in d.notes)
    d = analyze(replace(traces, unrecorded={2: Unrecorded(why)}), annotators=())  # host unknown
    assert any(n.startswith(f"rank 2 was not recorded: {why}") for n in d.notes)
