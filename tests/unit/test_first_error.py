"""The root cause of last resort (analysis/what/first_error.py): the run's first error, the call it
was raised in, and what the ranks that failed there passed differently."""

from __future__ import annotations

from nccl_doctor.analysis import analyze
from nccl_doctor.analysis.what.first_error import first_error
from nccl_doctor.diagnosis import FindingKind, Verdict
from nccl_doctor.model import EventState
from tests.unit.conftest import T0, STEP, clean, make_event, make_trace, make_traceset, raised


def failing(rank, output, at):
    events = [make_event(1), make_event(2, "all_gather_into_tensor", output=output,
                                         state=EventState.FAILED)]
    return make_trace(rank, events, raised("RuntimeError: invalid tensor size", time_ns=at))


def test_every_rank_failing_in_one_call_has_the_first_error_as_root_cause():
    traces = make_traceset([failing(0, "float32[3]", T0 + 5 * STEP),
                            failing(1, "float32[4]", T0 + 4 * STEP)], exit_status=1)
    found = first_error(traces)
    assert found is not None and found.kind is FindingKind.RANK_EXITED
    assert found.ranks == (1,) and "rank 0 failed in it too" in found.title
    assert found.evidence["differs"] == {"output": {"float32[3]": [0], "float32[4]": [1]}}
    d = analyze(traces, annotators=())
    assert d.verdict is Verdict.CRASH and d.root_cause is not None
    assert d.root_cause.title == found.title


def test_no_failure_no_fallback():
    traces = make_traceset([make_trace(r, [make_event(1)], clean()) for r in (0, 1)])
    assert first_error(traces) is None
    assert analyze(traces, annotators=()).root_cause is None
