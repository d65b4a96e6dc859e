"""A run's first steps (supervisor/start.py) and the launched job's end (supervisor/launch.py),
with real processes."""

from __future__ import annotations

import json
import sys

import pytest

from nccl_doctor.capture.claim import LOCK
from nccl_doctor.errors import LaunchFailed, OutDirInUse
from nccl_doctor.supervisor.launch import Job
from nccl_doctor.supervisor.start import Launch


def test_the_job_s_end_ends_the_wait_with_its_exit_status(tmp_path):
    job = Job([sys.executable, "-c", "import time; time.sleep(0.3); raise SystemExit(7)"], {})
    try:
        assert job.wait(0.01) is None  # still running: the wait ran out
        assert job.wait(60.0) == 7
        assert job.poll() == 7
    finally:
        job.release()


def test_a_launch_claims_the_directory_writes_the_manifest_and_starts_the_job(tmp_path):
    out = tmp_path / "a" / "out"
    launch = Launch([sys.executable, "-c", "import os; print(os.environ['NCCL_DOCTOR_DIR'])"],
                    out, {"PATH": "/usr/bin:/bin"})
    job = launch.begin()
    try:
        assert (out / LOCK).is_file()
        with pytest.raises(OutDirInUse):  # another run's claim is refused meanwhile
            Launch(["true"], out).claim()
        manifest = json.loads((out / "manifest.json").read_text())
        assert manifest["run_id"] == launch.run_id
        assert manifest["extra"]["supervisor"]["pid"] > 0
        assert job.wait(60.0) == 0
        ended = launch.ended(0)
        assert ended.exit_status == 0 and ended.ended_at >= manifest["started_at"]
    finally:
        launch.signals.restore()
        job.release()
        launch.release()
    assert not (out / LOCK).exists()


def test_a_launch_that_fails_leaves_nothing_behind(tmp_path):
    out = tmp_path / "made" / "out"
    launch = Launch(["/nonexistent/launcher"], out)
    with pytest.raises(LaunchFailed, match="cannot run '/nonexistent/launcher'"):
        launch.begin()
    assert launch.job is None
    assert not (tmp_path / "made").exists()  # the directories it made, removed


def test_a_job_left_unwatched_runs_to_its_end(tmp_path):
    out = tmp_path / "out"
    mark = tmp_path / "mark"
    launch = Launch([sys.executable, "-c", "import time, pathlib; time.sleep(0.2); "
                     f"pathlib.Path({str(mark)!r}).write_text('x'); raise SystemExit(4)"], out)
    launch.begin()
    assert launch.unwatched() == 4
    assert mark.read_text() == "x"
    assert not (out / LOCK).exists()
