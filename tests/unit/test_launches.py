"""``--nccl-doctor``'s launches (testing/launches.py) alone: a crash's report as failure text and
reason, and a launcher that cannot start left for ``subprocess`` to refuse as it would."""

from __future__ import annotations

import subprocess

import pytest

from nccl_doctor.testing.launches import Launches, describe, reason

CRASH = {"verdict": "crash", "exit_status": 1, "findings": [
    {"kind": "rank_exited", "root_cause": True, "severity": "error",
     "title": "rank 1 raised ValueError: no lr at train.py:12 while its peers still needed it",
     "detail": "rank 1 raised ValueError: no lr at train.py:12.", "callsite": "train.py:12",
     "hint": "Fix the error this rank raised."}]}


def test_a_crash_reads_as_a_crash() -> None:
    assert reason(CRASH) == ("a job this test launched crashed: rank_exited: rank 1 raised "
                             "ValueError: no lr at train.py:12 while its peers still needed it")
    text = describe(CRASH)
    assert text.splitlines()[0] == "nccl-doctor: a job this test launched crashed (exit status 1)"
    assert "callsite: train.py:12" in text and "fix: Fix the error this rank raised." in text
    assert "stopped" not in text
    bare = {"verdict": "crash", "exit_status": 3, "findings": []}
    assert reason(bare) == "a job this test launched crashed (exit status 3)"


def test_a_hang_still_reads_as_one() -> None:
    hang = {**CRASH, "verdict": "hang"}
    assert reason(hang).startswith("a job this test launched hung: rank_exited: ")
    assert describe(hang).startswith("nccl-doctor: a job this test launched hung; it was stopped")


def test_a_launcher_not_found_is_not_wrapped(tmp_path) -> None:
    """``torchrun`` not on PATH: FileNotFoundError, as without the doctor (not the doctor's
    own exit status for a command it could not start)."""
    with Launches(tmp_path, 60.0) as launches:
        with pytest.raises(FileNotFoundError):
            subprocess.run(["torchrun", "--nproc-per-node=2", "train.py"],
                           env={"PATH": str(tmp_path)})
        assert launches.runs == [] and launches.diagnosed() == []
        # the command the test gave is the one it sees, wrapped or not
        proc = subprocess.run(["true"], check=True)
        assert proc.args == ["true"]
    assert subprocess.Popen.__init__ is launches._original
