"""How a rank ended when its launcher skipped atexit (Ray, os._exit, a kill after success), and a
process that aborted on its way out after its work finished: never called a crash for that."""

from __future__ import annotations

from dataclasses import replace

from nccl_doctor.analysis import analyze
from nccl_doctor.analysis.calls.ends import with_finished_marked
from nccl_doctor.analysis.what.exited import HINT_CRASH
from nccl_doctor.diagnosis import FindingKind, Severity, Verdict
from nccl_doctor.location import Location
from nccl_doctor.model import ExitKind, RankExit

VANISHED = RankExit(ExitKind.VANISHED)
ABORT = RankExit(ExitKind.SIGNAL, signal="SIGABRT")


def test_a_rank_with_no_exit_record_whose_work_finished_is_finished(tb) -> None:
    """Ray's workers: every call completed, nobody waits, the job exited 0."""
    traces = tb.traceset([tb.trace(r, tb.collectives(5), VANISHED) for r in (0, 1)],
                         exit_status=0)
    assert {t.exit.kind for t in with_finished_marked(traces).ranks.values()} == {ExitKind.FINISHED}
    d = analyze(traces)
    assert d.verdict is Verdict.OK and d.findings == (), [f.title for f in d.findings]
    assert {r.state for r in d.ranks} == {"finished"}


def test_it_stays_vanished_when_peers_needed_it_or_the_job_failed(tb) -> None:
    behind = tb.traceset([tb.trace(0, tb.collectives(5), tb.clean()),
                          tb.trace(1, tb.collectives(3), VANISHED)], exit_status=0)
    assert with_finished_marked(behind).ranks[1].exit.kind is ExitKind.VANISHED
    assert analyze(behind).verdict is Verdict.CRASH
    failed = tb.traceset([tb.trace(r, tb.collectives(5), VANISHED) for r in (0, 1)],
                         exit_status=1)
    assert {t.exit.kind for t in with_finished_marked(failed).ranks.values()} == {ExitKind.VANISHED}
    inside = tb.traceset([tb.trace(0, tb.collectives(5, last_state=tb.ENTERED), VANISHED),
                          tb.trace(1, tb.collectives(5), VANISHED)], exit_status=0)
    assert with_finished_marked(inside).ranks[0].exit.kind is ExitKind.VANISHED


def test_a_destroyed_process_group_says_the_work_finished(tb) -> None:
    """destroy_process_group() was noted: whatever the job's status, its distributed work was
    done (the job failed elsewhere, later)."""
    done = replace(tb.trace(0, tb.collectives(5), VANISHED), notes=({"note": "destroyed"},))
    traces = tb.traceset([done, tb.trace(1, tb.collectives(5), tb.clean())], exit_status=1)
    assert with_finished_marked(traces).ranks[0].exit.kind is ExitKind.FINISHED


def test_an_abort_at_teardown_after_the_work_is_described_as_such(tb) -> None:
    traces = tb.traceset([tb.trace(0, tb.collectives(5), tb.clean()),
                          tb.trace(1, tb.collectives(5), ABORT)], exit_status=1)
    d = analyze(traces)
    (f,) = [f for f in d.findings if f.kind is FindingKind.RANK_EXITED]
    assert f.severity is Severity.WARNING and f.ranks == (1,)
    assert "aborted at teardown (SIGABRT) after all_reduce #5 (group 0) completed" in f.title
    assert "no error was raised" in f.title and f.hint != HINT_CRASH
    assert "raised" not in f.hint.replace("No error was raised", "")


def test_a_signal_while_python_ran_stays_a_crash(tb) -> None:
    """A fault with a Python frame running (faulthandler named one) is a crash in the code."""
    segv = RankExit(ExitKind.SIGNAL, signal="SIGSEGV", callsite=Location("/job/train.py", 9, "f"))
    traces = tb.traceset([tb.trace(0, tb.collectives(5), tb.clean()),
                          tb.trace(1, tb.collectives(5), segv)], exit_status=1)
    d = analyze(traces)
    assert d.verdict is Verdict.CRASH
    (f,) = [f for f in d.findings if f.kind is FindingKind.RANK_EXITED]
    assert f.severity is Severity.ERROR and f.hint == HINT_CRASH
