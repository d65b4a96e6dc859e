"""Issue 51: ``check --fix``, then the real job. The desyncs of jobs/fixable.py (and the branch
jobs' rank-0 barrier, rank-0 broadcast and the helper's rank-0 reduce, whose hangs
test_branch_jobs.py diagnoses) are fixed in a copy; ``check`` on it is then clean, and the
fixed program runs healthy on 2 real gloo ranks under the doctor."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration

JOBS = Path(__file__).parent / "jobs"
CLI = [sys.executable, "-m", "nccl_doctor", "check"]


def check(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([*CLI, *args], cwd=cwd, capture_output=True, text=True, timeout=120)


def assert_healthy(job) -> None:
    report = json.loads((job.out / "report.json").read_text())
    assert job.exit_status == 0, report["findings"]
    assert report["verdict"] == "ok" and report["findings"] == [], report["findings"]


def test_the_fixed_job_checks_clean_and_runs_healthy(run_job, tmp_path):
    script = tmp_path / "fixable.py"
    shutil.copy(JOBS / "fixable.py", script)
    before = check("--format", "json", "fixable.py", cwd=tmp_path)
    assert before.returncode == 1
    assert [f["code"] for f in json.loads(before.stdout)["findings"]] == ["ND001"] * 3
    fixed = check("--fix", "fixable.py", cwd=tmp_path)
    assert fixed.returncode == 0, fixed.stdout + fixed.stderr
    assert "fixed 3 of 3 findings in 1 file; no finding in 1 file left" in fixed.stderr
    again = check("fixable.py", cwd=tmp_path)
    assert again.returncode == 0 and again.stdout == "", again.stdout
    assert "# the mean loss, for the log" in script.read_text()  # (comments kept)
    assert_healthy(run_job(2, str(script)))


@pytest.mark.parametrize("scenario", ["rank0_barrier", "via_variable", "in_helper"])
def test_the_branch_jobs_hangs_once_fixed_run_healthy(run_job, tmp_path, scenario):
    for name in ("branches.py", "branch_helpers.py"):
        shutil.copy(JOBS / name, tmp_path / name)
    shutil.copytree(JOBS / "site-packages", tmp_path / "site-packages")
    fixed = check("--fix", "branches.py", "branch_helpers.py", cwd=tmp_path)
    assert fixed.returncode == 1, fixed.stderr  # (the early exit and the caller's call are left)
    left = {line.split(": ")[1].split()[0] for line in fixed.stdout.splitlines()}
    assert left == {"ND002", "ND003"}, fixed.stdout
    assert_healthy(run_job(2, str(tmp_path / "branches.py"), env={"SCENARIO": scenario}))
