"""The advice of a finding fits where the ranks ran: a job's launcher options (torchrun's
--max-restarts) in a job, the test in a distributed test of the pytest plugin - read from the
launched command, so a replay of a kept capture gives the same advice."""

from __future__ import annotations

from dataclasses import replace

from nccl_doctor.analysis import analyze
from nccl_doctor.analysis.what.exited import HINT_CRASH
from nccl_doctor.analysis.calls.setting import TEST_WORKER, Setting, setting_of, setting_of_command
from nccl_doctor.diagnosis import FindingKind
from nccl_doctor.location import Location
from nccl_doctor.model import EventState, ExitKind, RankExit

TEST_COMMAND = ("python", "-S", "-c", "...", "--zygote", "/tmp/s", "--nproc", "2", "-m",
                TEST_WORKER, "/tmp/payload.pkl")


def test_the_plugins_command_is_a_test_and_any_other_a_job() -> None:
    assert setting_of_command(TEST_COMMAND) is Setting.TEST
    assert setting_of_command(("python", "-m", "nccl_doctor.testing.spawn", "--nproc", "2", "-m",
                               TEST_WORKER, "p.pkl")) is Setting.TEST
    for job in ((), ("torchrun", "--nproc-per-node=2", "train.py"),
                ("python", TEST_WORKER), ("python", "-m", "torch.distributed.run", "x.py")):
        assert setting_of_command(job) is Setting.JOB, job


def _one_rank_asserts(tb, command: tuple[str, ...]):
    """Rank 1 raised AssertionError after all_reduce #4; rank 0 waited in #5, then lost it."""
    failed = RankExit(ExitKind.EXCEPTION, code=1, exception="AssertionError: rank 1 disagrees",
                      callsite=Location("/t/test_x.py", 12, "test_x"))
    traces = tb.traceset([
        tb.trace(0, tb.collectives(5, last_state=EventState.FAILED),
                 tb.raised("RuntimeError: Connection closed by peer")),
        tb.trace(1, tb.collectives(4), failed)], exit_status=1)
    return replace(traces, command=command)


def test_in_a_test_the_fix_names_the_assertion_and_the_wait_not_a_launcher(tb) -> None:
    traces = _one_rank_asserts(tb, TEST_COMMAND)
    assert setting_of(traces) is Setting.TEST
    root = analyze(traces).root_cause
    assert root is not None and root.kind is FindingKind.RANK_EXITED and root.ranks == (1,)
    assert root.hint == ("The assertion failed on rank 1: fix the test or the code under test; "
                         "the other ranks waited for it in all_reduce #5 (group 0) and failed "
                         "only because it was gone.")
    assert "torchrun" not in root.hint and "restart" not in root.hint


def test_in_a_job_the_fix_keeps_the_launchers_advice(tb) -> None:
    root = analyze(_one_rank_asserts(tb, ("torchrun", "train.py"))).root_cause
    assert root is not None and root.hint == HINT_CRASH and "--max-restarts" in root.hint


def test_in_a_test_other_exceptions_and_signals_are_named(tb) -> None:
    for exit, words in ((tb.raised("ValueError: bad input"),
                         "Rank 1 raised ValueError in the test"),
                        (RankExit(ExitKind.SIGNAL, signal="SIGSEGV"),
                         "Rank 1 was killed by SIGSEGV during the test")):
        traces = replace(tb.traceset([tb.trace(0, tb.collectives(5), tb.clean()),
                                      tb.trace(1, tb.collectives(3), exit)], exit_status=1),
                         command=TEST_COMMAND)
        root = analyze(traces).root_cause
        assert root is not None and root.hint.startswith(words), root.hint
        assert "torchrun" not in root.hint
