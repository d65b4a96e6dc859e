"""Who is wrong, and why, on plain torch (issue 39): real 2-rank gloo jobs whose ranks part at a
branch on the rank, written the ways users write it (tests/integration/jobs/branches.py). The
report names the branch (file:line and its source) and blames the side that took it, live and
in replay; a healthy run names none."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration

JOBS = Path(__file__).parent / "jobs"
SCRIPT = JOBS / "branches.py"


def line_of(path: Path, text: str, after: str | None = None) -> int:
    """The line number of the first line of ``path`` holding ``text`` (after the line holding
    ``after``): the tests never hard-code a line."""
    lines = path.read_text().splitlines()
    start = 0
    if after is not None:
        start = next(i for i, line in enumerate(lines) if after in line) + 1
    return next(i for i, line in enumerate(lines[start:], start + 1) if text in line)


def replayed(out: Path) -> dict:
    proc = subprocess.run([sys.executable, "-m", "nccl_doctor", "replay", "--format", "json",
                           str(out)], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return json.loads(proc.stdout)


def root_of(report: dict) -> dict:
    (root,) = [f for f in report["findings"] if f["root_cause"]]
    return root


# scenario -> (the culprit ranks, the file holding the branch, its text, after which line,
# the kind of the deciding branch)
CASES = {
    "rank0_barrier": ([0], SCRIPT, "if rank == 0:", 'scenario == "rank0_barrier"', "if"),
    "skip_continue": ([1], SCRIPT, "if rank == 1 and step == 2:", 'scenario == "skip_continue"',
                      "jump"),
    "via_variable": ([0], SCRIPT, "if is_master:", "is_master = rank == 0", "if"),
    "in_helper": ([0], JOBS / "branch_helpers.py", "if rank == 0:", None, "if"),
    "in_caller": ([0], SCRIPT, "if rank == 0:", 'scenario == "in_caller"', "if"),
    "in_library": ([0], JOBS / "site-packages" / "acme_metrics" / "__init__.py",
                   "if dist.get_rank() == 0:", None, "if"),
}


@pytest.mark.parametrize("scenario", sorted(CASES))
def test_the_branch_on_the_rank_is_named_and_blames_the_side_that_took_it(run_job, scenario):
    culprit, where, text, after, kind = CASES[scenario]
    job = run_job(2, str(SCRIPT), env={"SCENARIO": scenario})
    live = json.loads((job.out / "report.json").read_text())
    line = line_of(where, text, after)
    for report in (live, replayed(job.out)):
        assert report["verdict"] in ("hang", "crash"), report["findings"]
        root = root_of(report)
        assert root["kind"] in ("collective_mismatch", "missing_collective"), root
        assert root["ranks"] == culprit, (root["ranks"], root["detail"])
        branch = root["branch"]
        assert branch is not None, root["detail"]
        assert branch["path"] == str(where) and branch["line"] == line, branch
        assert branch["text"] == text and branch["ranks"] == culprit, branch
        assert branch["kind"] == kind and branch["culprit"] is True, branch
        assert root["evidence"]["blame"] == "branch", root["evidence"]
        assert f"{where.name}:{line}" in root["detail"] and text in root["detail"], root["detail"]
    if scenario == "in_library":
        # the library's own line: installed code, named with its package
        assert root["branch"]["library"] == "acme_metrics", root["branch"]
    # the console names it too
    console = subprocess.run([sys.executable, "-m", "nccl_doctor", "replay", str(job.out)],
                             capture_output=True, text=True, timeout=120).stdout
    assert "branch: " in console and f"{where.name}:{line}  {text}" in console, console


def test_a_healthy_run_names_no_branch(run_job):
    job = run_job(2, str(SCRIPT), env={"SCENARIO": "healthy"})
    assert job.exit_status == 0
    for report in (json.loads((job.out / "report.json").read_text()), replayed(job.out)):
        assert report["verdict"] == "ok" and report["findings"] == [], report["findings"]
        assert "branch" not in json.dumps(report["findings"])


def test_user_code_patterns_make_an_installed_package_yours(tmp_path):
    """`run --user-code PATTERN`: the installed helper is the user's own package; its frame
    is then "your line" and its branch the user's (no library named), live and in replay."""
    out = tmp_path / "out"
    proc = subprocess.run(
        [sys.executable, "-m", "nccl_doctor", "run", "--out", str(out), "--user-code",
         "*/acme_metrics/*", "--", sys.executable, "-m", "nccl_doctor.testing.spawn", "--nproc",
         "2", str(SCRIPT)], env={**os.environ, "SCENARIO": "in_library"},
        capture_output=True, text=True, timeout=300)
    assert proc.returncode != 0, proc.stderr[-2000:]
    library = JOBS / "site-packages" / "acme_metrics" / "__init__.py"
    for report in (json.loads((out / "report.json").read_text()), replayed(out)):
        root = root_of(report)
        assert root["ranks"] == [0] and root["branch"]["library"] is None, root["branch"]
        assert root["branch"]["path"] == str(library), root["branch"]
        (side,) = [s for s in root["evidence"]["sides"] if s["ranks"] == [0]]
        # the helper's own line is the user's line now, not the script's call of it
        assert side["your_line"].endswith(f"__init__.py:{line_of(library, 'dist.all_reduce')}"), side


@pytest.mark.parametrize("scenario,rule", [("rank0_barrier", "ND001"),
                                           ("skip_continue", "ND003"), ("in_caller", "ND002")])
def test_the_report_names_the_rule_check_finds_it_by_before_the_run(run_job, scenario, rule):
    """Issue 51: the run points back - the root cause's branch is one ``nccl-doctor check``
    finds, and the report says so (its detail, evidence.check_rule), live and replayed."""
    _, where, text, after, _ = CASES[scenario]
    job = run_job(2, str(SCRIPT), env={"SCENARIO": scenario})
    line = line_of(where, text, after)
    for report in (json.loads((job.out / "report.json").read_text()), replayed(job.out)):
        root = root_of(report)
        said = root["evidence"]["check_rule"]
        assert said["code"] == rule and said["path"] == str(where), said
        assert f"`nccl-doctor check` finds this before the run: {rule} at" in root["detail"]
        assert root["branch"]["line"] == line
    said = f"finds this before the run: {rule} at"
    page = subprocess.run([sys.executable, "-m", "nccl_doctor", "replay", "--format", "html",
                           str(job.out)], capture_output=True, text=True, timeout=120).stdout
    assert said in page, "the HTML page does not say the rule"
    console = subprocess.run([sys.executable, "-m", "nccl_doctor", "replay", str(job.out)],
                             capture_output=True, text=True, timeout=120,
                             env={**os.environ, "COLUMNS": "400"}).stdout
    assert said in console, console
