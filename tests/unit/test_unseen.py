"""Calls nothing recorded (analysis/calls/align.py ``unseen``): a rank's recorded calls that skip
sequence numbers, with nothing missing from its capture between them, made calls nobody saw;
records the capture lost are not counted; the gap never shifts the alignment and never makes a
rank missing from a call it made unseen."""

from __future__ import annotations

from nccl_doctor.analysis import analyze
from nccl_doctor.analysis.calls.align import timelines, unseen_lines
from nccl_doctor.diagnosis import FindingKind
from nccl_doctor.model import EventKind


def numbered(tb, seqs, *, state_last=None):
    """One call per sequence number, at consecutive record indices (nothing lost between)."""
    out = [tb.event(i + 1, seq=s) for i, s in enumerate(seqs)]
    if state_last is not None:
        out[-1] = tb.event(len(seqs), seq=seqs[-1], state=state_last)
    return out


def test_numbers_skipped_between_neighbouring_records_are_unseen(tb) -> None:
    ts = tb.traceset([tb.trace(0, numbered(tb, [1, 2, 4, 5, 8]), tb.clean()),
                      tb.trace(1, numbered(tb, [1, 2, 3, 4, 5, 6, 7, 8]), tb.clean())])
    (line,) = timelines(ts).values()
    assert line.unseen == {0: (3, 6, 7)}
    # aligned by number: rank 0's call #4 sits beside rank 1's #4, not beside its #3
    assert line.calls[4][0].idx == 3 and line.calls[4][1].idx == 4
    d = analyze(ts)
    assert not [f for f in d.findings if f.kind in (
        FindingKind.MISSING_COLLECTIVE, FindingKind.COLLECTIVE_MISMATCH)], d.findings
    (note,) = unseen_lines(ts)
    assert note.startswith("rank 0 made collectives at sequence numbers #3, #6, #7 of group 0 "
                           "that were not recorded"), note


def test_records_the_capture_lost_are_not_unseen_calls(tb) -> None:
    # record 3 is gone (a lapped ring, a window): the jump from #2 to #4 is the loss, not a call
    kept = [e for e in numbered(tb, [1, 2, 3, 4]) if e.idx != 3]
    ts = tb.traceset([tb.trace(0, kept, tb.clean()),
                      tb.trace(1, numbered(tb, [1, 2, 3, 4]), tb.clean())])
    (line,) = timelines(ts).values()
    assert line.unseen == {}
    assert unseen_lines(ts) == []


def test_a_call_taking_several_numbers_leaves_no_gap(tb) -> None:
    first = tb.event(1, seq=1, seq_delta=3)  # a coalesced call: three numbers
    ts = tb.traceset([tb.trace(0, [first, tb.event(2, seq=4)], tb.clean())], world_size=1)
    assert timelines(ts)["0"].unseen == {}


def test_a_skip_after_unseen_calls_is_still_the_skippers(tb) -> None:
    # rank 1 made #3 unseen, then never made #5: it is missing from #5, not from #3
    ts = tb.traceset([tb.trace(0, numbered(tb, [1, 2, 3, 4, 5], state_last=tb.ENTERED)),
                      tb.trace(1, numbered(tb, [1, 2, 4]), tb.clean())])
    (line,) = timelines(ts).values()
    assert line.unseen == {1: (3,)}
    missing = [f for f in analyze(ts).findings if f.kind is FindingKind.MISSING_COLLECTIVE]
    assert [(f.seq, f.ranks) for f in missing] == [(5, (1,))], missing
    # the finding says so itself
    assert missing[0].evidence["unseen"] == {"1": [3]}
    assert "rank 1 made a collective at #3 of group 0 that was not recorded: issued from C++" \
        in missing[0].detail, missing[0].detail


def test_calls_unseen_before_the_groups_destroy_are_named(tb) -> None:
    # the destroy records the number the next call would have had: #4 and #5 went unseen
    destroy = tb.event(4, op="destroy_process_group", seq=6, kind=EventKind.DESTROY, seq_delta=0)
    ts = tb.traceset([tb.trace(0, [*numbered(tb, [1, 2, 3]), destroy], tb.clean())],
                     world_size=1)
    assert timelines(ts)["0"].unseen == {0: (4, 5)}


# -- who left first, by the times, where the recorded calls are as many ------------------------

def lost_peer(tb, *, leaver_notes=(), loser_notes=()):
    """Rank 1 ended cleanly at T; rank 0 raised "Connection closed by peer" after it; both
    recorded three calls (the one rank 0 was left in, DDP's, nothing recorded)."""
    from dataclasses import replace as with_

    from nccl_doctor.model import ExitKind, RankExit

    t_end = tb.T0 + 10 * tb.STEP
    leaver = with_(tb.trace(1, numbered(tb, [1, 2, 3]), tb.clean(time_ns=t_end)),
                   notes=tuple(leaver_notes))
    loser = with_(tb.trace(0, numbered(tb, [1, 2, 3]), RankExit(
        ExitKind.EXCEPTION, code=1, exception="RuntimeError: Connection closed by peer",
        time_ns=t_end + tb.STEP)), notes=tuple(loser_notes))
    return tb.traceset([loser, leaver])


def test_the_rank_that_let_go_before_its_peer_lost_it_is_the_cause(tb) -> None:
    root = analyze(lost_peer(tb)).root_cause
    assert root.kind is FindingKind.RANK_EXITED and root.ranks == (1,), root


def test_a_peer_that_lost_it_at_its_own_teardown_blames_nobody_that_left(tb) -> None:
    # rank 0 had destroyed its own group: the error came at its teardown, nothing was missed
    d = analyze(lost_peer(tb, loser_notes=[{"note": "destroyed", "time_ns": tb.T0}]))
    assert not [f for f in d.findings if f.ranks == (1,)], d.findings
