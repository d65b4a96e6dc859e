"""Calls paired across steps (analysis/silent/step_skew.py), on synthetic traces: each pass of a
loop makes a marker call (line 10, group "m") and then the call of interest (line 20, group
"s"). A rank that skips a pass's call and makes the next pairs two steps; a marker that is
itself skipped, or made twice a pass, counts no wrong steps; a capture that lost its start is
not read."""

from __future__ import annotations

from dataclasses import replace

from nccl_doctor.analysis.silent.step_skew import detect_step_skew
from nccl_doctor.diagnosis import FindingKind, Severity


def passes(tb, rank, n, *, skip_call=(), skip_marker=(), every=1, first_idx=1):
    events, idx, seq = [], first_idx - 1, {"m": 0, "s": 0}
    for p in range(1, n + 1):
        if p not in skip_marker:
            idx += 1
            seq["m"] += 1
            events.append(tb.event(idx, group="m", seq=seq["m"], line=10))
        if p % every == 0 and p not in skip_call:
            idx += 1
            seq["s"] += 1
            events.append(tb.event(idx, group="s", seq=seq["s"], line=20))
    return tb.trace(rank, events, tb.clean())


def job(tb, *traces):
    return tb.traceset(list(traces), {"m": (0, 1), "s": (0, 1)})


def test_a_skipped_step_pairs_the_next_steps_call_with_the_peers_step_before(tb):
    (f,) = detect_step_skew(job(tb, passes(tb, 0, 7, skip_call=(3,)), passes(tb, 1, 6)))
    assert (f.kind, f.severity, f.ranks, f.group, f.seq) == (
        FindingKind.STEP_SKEW, Severity.WARNING, (0,), "s", 3)
    assert "paired rank 0's step 4 with rank 1's step 3" in f.title, f.title
    ev = f.evidence
    assert dict(ev.steps) == {0: 4, 1: 3} and dict(ev.skipped) == {0: [3]}, ev
    assert ev.marker["line"] == 10 and ev.marker["per_step"] == 1, ev.marker
    assert ev.groups == ({"group": "s", "seq": 3, "pairs": 4},), ev.groups
    assert "rank 0 made no all_reduce at /job/train.py:20 in step 3" in f.detail, f.detail


def test_the_same_steps_on_every_rank_read_nothing(tb):
    assert detect_step_skew(job(tb, passes(tb, 0, 6), passes(tb, 1, 6))) == []
    # gradient accumulation: the call every second pass, the marker twice between two calls
    assert detect_step_skew(job(tb, passes(tb, 0, 6, every=2), passes(tb, 1, 6, every=2))) == []


def test_a_skipped_marker_counts_no_step(tb):
    """The marker itself skipped on a rank (its pass made the call of interest all the same):
    it does not count that rank's passes, and no skew is read."""
    traces = job(tb, passes(tb, 0, 6, skip_marker=(3,)), passes(tb, 1, 6))
    assert detect_step_skew(traces) == []


def test_a_capture_that_lost_its_start_is_read_from_its_sequence_numbers(tb):
    """A rank whose first records are gone (a lapped ring, a long run's window): its steps are
    numbered from the marker's sequence numbers in its group, and the skew is read all the
    same."""
    traces = job(tb, passes(tb, 0, 7, skip_call=(3,), first_idx=5), passes(tb, 1, 6))
    (f,) = detect_step_skew(traces)
    assert dict(f.evidence.steps) == {0: 4, 1: 3} and f.ranks == (0,), f.evidence
    assert "Read from the newest records of rank 0 only" in f.detail, f.detail


def test_a_cut_capture_whose_marker_group_steps_unevenly_is_not_read(tb):
    """Cut, and the marker's group makes another call every third pass: its sequence numbers
    do not count the passes, and nothing is said."""
    def uneven(rank, n, skip=()):
        trace = passes(tb, rank, n, skip_call=skip, first_idx=5)
        events, bump = [], 0
        for e in trace.events:
            if e.group == "m":
                bump += 1 if e.seq % 3 == 0 else 0
                e = replace(e, seq=e.seq + bump)
            events.append(e)
        return replace(trace, events=tuple(events))

    assert detect_step_skew(job(tb, uneven(0, 7, (3,)), uneven(1, 6))) == []


def test_only_the_newest_unbroken_records_of_a_cut_capture_are_read(tb):
    """A window keeps records around a divergence and the newest ones: the steps are read from
    the newest unbroken run only (a marker before a gap counts no pass after it)."""
    full = passes(tb, 0, 9, skip_call=(3,))
    kept = full.events[:2] + full.events[8:]  # (a gap after the first pass)
    traces = job(tb, replace(full, events=kept), passes(tb, 1, 8))
    (f,) = detect_step_skew(traces)
    assert dict(f.evidence.steps) == {0: 6, 1: 5}, f.evidence  # the first pair read
