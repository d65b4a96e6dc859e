"""Why the ranks parted, across calls and data (issue 50, part 4), on real gloo jobs, live and
replayed: the branch on the rank whose test reads the rank through another function
(tests/integration/jobs/interprocedural.py: an argument, a helper's return, an attribute, a
framework-like property) is named and blames the side that took it; a decoy flag that does not
decide the call is never named; a NaN guard on a 2 x 2 mesh (jobs/nan_guard.py) is named as a
jump the data decided, with the ranks that took it."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from test_branch_jobs import line_of, replayed, root_of  # (this directory: on sys.path)

pytestmark = pytest.mark.integration

JOBS = Path(__file__).parent / "jobs"
SCRIPT = JOBS / "interprocedural.py"
NAN = JOBS / "nan_guard.py"

# scenario -> (the culprit ranks, the branch's text, after which line, its kind, its names, a
# piece of how it reads the rank through another function, or None)
CASES = {
    "argument": ([0], "if is_main:", "def share", "if", ["is_main"],
                 "`is_main` is `rank == 0`, passed at "),
    "helper_return": ([0], "if is_main():", 'scenario == "helper_return"', "if", ["is_main()"],
                      "`is_main()` returns `dist.get_rank() == 0`"),
    "attribute": ([0], "if self.is_main:", "def step", "if", ["self.is_main"],
                  "`self.is_main` is set to `dist.get_rank() == 0` in Worker.__init__"),
    # by its name, as accelerate's is read
    "framework_property": ([0], "if acc.is_main_process:", "def save", "if",
                           ["acc.is_main_process"], None),
}


@pytest.mark.parametrize("scenario", sorted(CASES))
def test_a_branch_reading_the_rank_through_another_function_is_named(run_job, scenario):
    culprit, text, after, kind, names, via = CASES[scenario]
    job = run_job(2, str(SCRIPT), env={"SCENARIO": scenario})
    line = line_of(SCRIPT, text, after)
    for report in (json.loads((job.out / "report.json").read_text()), replayed(job.out)):
        assert report["verdict"] == "hang", report["findings"]
        root = root_of(report)
        assert root["kind"] == "collective_mismatch", root
        assert root["ranks"] == culprit, (root["ranks"], root["detail"])
        branch = root["branch"]
        assert branch is not None, root["detail"]
        assert (branch["path"], branch["line"], branch["text"]) == (str(SCRIPT), line, text)
        assert branch["kind"] == kind and branch["names"] == names, branch
        assert branch["culprit"] is True and root["evidence"]["blame"] == "branch", root
        assert "No branch on the rank was found" not in root["detail"]
        (seen,) = [b for b in root["evidence"]["branches"] if b["line"] == line
                   and b["kind"] == kind]
        if via is None:
            assert "via" not in seen and "through another function" not in root["detail"]
        else:
            assert via in seen["via"][0] and via in root["detail"], (seen, root["detail"])


def test_a_decoy_flag_that_does_not_decide_the_call_is_never_named(run_job):
    """``if is_main: print(...)`` in the function that makes the collective, the flag passed
    as ``rank == 0``: it reads the rank, it is on the path, and it decided nothing. The ranks
    part because rank 0 runs the loop once more (its length from the environment)."""
    job = run_job(2, str(SCRIPT), env={"SCENARIO": "decoy", "DECOY_STEPS_0": "3",
                                       "DECOY_STEPS_1": "2"})
    decoy = line_of(SCRIPT, "if is_main:", "def logged_share")
    for report in (json.loads((job.out / "report.json").read_text()), replayed(job.out)):
        root = root_of(report)
        assert root["kind"] == "collective_mismatch", root
        assert root["branch"] is None, root["branch"]
        assert all(b["line"] != decoy for b in root["evidence"].get("branches", [])), root
        assert f"interprocedural.py:{decoy}" not in root["detail"], root["detail"]
        assert "data_jump" not in root["evidence"]
        # what parted them is said instead: rank 0 made one call more from the helper's line
        # (the recorded call path ends at the user's innermost line: the loop around the
        # helper's call is counted as the calls made from that line)
        call = line_of(SCRIPT, "dist.all_reduce(t)", "def logged_share")
        assert root["evidence"]["loop"]["line"] == call, root["evidence"]
        assert "rank 1 made 1 call fewer than rank 0" in root["detail"], root["detail"]


def test_a_nan_guard_on_a_2x2_mesh_is_named_as_data_with_the_ranks_that_took_it(run_job):
    job = run_job(4, str(NAN))
    guard = line_of(NAN, "if not torch.isfinite(loss).all():")
    skipped = line_of(NAN, "dist.all_reduce(grad, group=dp)")
    for report in (json.loads((job.out / "report.json").read_text()), replayed(job.out)):
        assert report["verdict"] == "hang", report["findings"]
        # the root cause is where the ranks parted: a data-parallel group's all_reduce (the
        # world barrier ranks 0, 1 wait in is a consequence: ranks 2, 3 have not reached it)
        root = root_of(report)
        assert root["kind"] == "missing_collective" and root["op"] == "all_reduce", root
        (took,) = root["ranks"]
        assert took in (0, 1), root
        jump = root["evidence"]["data_jump"]
        assert (jump["line"], jump["leaves"], jump["ranks"]) == (guard, "continue", [took]), jump
        assert jump["call_line"] == skipped and jump["times"][str(took)] == 1, jump
        branch = root["branch"]
        assert (branch["line"], branch["kind"], branch["ranks"]) == (guard, "jump", [took])
        assert branch["names"] == [] and branch["skips"] is True, branch
        assert "culprit" not in branch  # the data parted them, not a side's code
        assert "because of the data, not the rank number" in root["detail"], root["detail"]
        assert f"rank {took} took the `continue` at" in root["detail"], root["detail"]
        assert "a different number of times" not in root["detail"]  # not a shorter loop
        # the barrier's finding names both ranks that took it
        (barrier,) = [f for f in report["findings"] if f["op"] == "barrier"]
        assert barrier["evidence"]["data_jump"]["ranks"] == [0, 1], barrier["evidence"]
        assert "ranks 0, 1 took the `continue` at" in barrier["detail"], barrier["detail"]
        # each data-parallel group's own missing all_reduce names the rank of it that took it
        for finding in report["findings"]:
            if finding["kind"] == "missing_collective" and finding["op"] == "all_reduce":
                (took,) = finding["evidence"]["data_jump"]["ranks"]
                assert took in (0, 1) and finding["branch"]["ranks"] == [took], finding
    console = subprocess.run([sys.executable, "-m", "nccl_doctor", "replay", str(job.out)],
                             capture_output=True, text=True, timeout=120).stdout
    assert f"nan_guard.py:{guard}  if not torch.isfinite(loss).all():" in console, console


def test_the_nan_guard_job_without_a_nan_is_healthy_and_names_nothing(run_job):
    job = run_job(4, str(NAN), env={"NAN_STEP": "-1"})
    assert job.exit_status == 0
    for report in (json.loads((job.out / "report.json").read_text()), replayed(job.out)):
        assert report["verdict"] == "ok" and report["findings"] == [], report["findings"]
