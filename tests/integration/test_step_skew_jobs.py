"""Calls paired across steps (issue 50, part 4's silent desync) on real gloo jobs on a 2 x 2
mesh, live and replayed: a NaN guard that skips one pass's data-parallel all_reduce in a loop
that counts its successful steps never hangs, and every all_reduce after it averages two steps
(jobs/step_skew.py); the doctor says which call paired which steps, the pass each rank
skipped and the guard, and says it while the job still runs. The healthy twin and gradient
accumulation read ok; the NaN guard that does hang (jobs/nan_guard.py) says it beside its root
cause."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import spawn  # (this directory: on sys.path)
from nccl_doctor.analysis import analyze
from nccl_doctor.analysis.calls.loaded import load_capture_dir
from nccl_doctor.capture.window import Size
from test_branch_jobs import line_of, replayed, root_of

pytestmark = pytest.mark.integration

JOBS = Path(__file__).parent / "jobs"
SKEW = JOBS / "step_skew.py"
NAN = JOBS / "nan_guard.py"


def skews(report: dict) -> list[dict]:
    return [f for f in report["findings"] if f["kind"] == "step_skew"]


@pytest.mark.parametrize("nan_pass", [0, 3])
def test_a_skipped_step_that_still_pairs_is_a_silent_desync(run_job, nan_pass):
    job = run_job(4, str(SKEW), env={"SCENARIO": "skip", "NAN_PASS": str(nan_pass)})
    skipped = nan_pass + 1  # the step (1-based) ranks 0, 1 made no data-parallel all_reduce in
    assert job.exit_status == 0
    for report in (json.loads((job.out / "report.json").read_text()), replayed(job.out)):
        assert report["verdict"] == "suspect", report["findings"]
        (f,) = skews(report)
        assert f["ranks"] == [0, 1] and f["seq"] == skipped, f
        assert (f"all_reduce #{skipped} of group {f['group']} [0, 2] paired rank 0's step "
                f"{skipped + 1} with rank 2's step {skipped}") in f["title"], f["title"]
        ev = f["evidence"]
        assert ev["steps"] == {"0": skipped + 1, "2": skipped}, ev
        assert ev["skipped"] == {"0": [skipped], "1": [skipped]}, ev
        assert ev["marker"]["line"] == line_of(SKEW, "dist.all_reduce(loss, group=tp)"), ev
        assert f["callsite"].endswith(f":{line_of(SKEW, 'dist.all_reduce(grad, group=dp)')}")
        assert [g["seq"] for g in ev["groups"]] == [skipped, skipped], ev["groups"]
        assert ev["data_jump"]["line"] == line_of(SKEW, "if not torch.isfinite(loss).all():")
        assert ev["data_jump"]["leaves"] == "continue"
        assert "because of the data, not the rank number" in f["detail"], f["detail"]
    # a long run's window (its newest records only, as the supervisor looks at a job past
    # 100,000 records): the steps are read from the sequence numbers, the skew all the same
    windowed = analyze(load_capture_dir(job.out, window=Size(above=0, tails=0, tail=12)))
    (f,) = [f for f in windowed.findings if f.kind.value == "step_skew"]
    assert f.ranks == (0, 1) and "Read from the newest records of" in f.detail, f.detail
    assert dict(f.evidence.steps)[0] == dict(f.evidence.steps)[2] + 1, f.evidence


@pytest.mark.parametrize("scenario", ["healthy", "accumulate"])
def test_the_same_steps_on_every_rank_read_ok(run_job, scenario):
    job = run_job(4, str(SKEW), env={"SCENARIO": scenario})
    for report in (json.loads((job.out / "report.json").read_text()), replayed(job.out)):
        assert report["verdict"] == "ok", report["findings"]
        assert skews(report) == []


def test_a_nan_guard_that_hangs_says_the_skew_beside_its_root_cause(run_job):
    job = run_job(4, str(NAN))
    report = json.loads((job.out / "report.json").read_text())
    assert report["verdict"] == "hang"
    assert root_of(report)["kind"] == "missing_collective"
    (f,) = skews(report)
    assert not f["root_cause"] and f["ranks"] == [0, 1] and f["seq"] == 3, f
    assert f["evidence"]["steps"] == {"0": 4, "2": 3}, f["evidence"]


def test_the_skew_is_said_while_the_job_runs(tmp_path):
    """Not only at the end: the supervisor's silent watch reads it from the calls as they are
    made and announces it while every rank is still in its loop."""
    out = tmp_path / "capture"
    env = dict(os.environ, SCENARIO="skip", STEPS="60", PAUSE="0.25", NAN_PASS="1")
    proc = subprocess.Popen([sys.executable, "-m", "nccl_doctor", "run", "--out", str(out),
                             "--", *spawn(4, str(SKEW))], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    try:
        said = None
        for line in proc.stderr:
            if "SUSPECT: step_skew:" in line:
                said = line
                running = proc.poll() is None
                break
        assert said is not None, "the skew was never announced"
        assert "paired rank 0's step 3 with rank 2's step 2" in said, said
        assert running, "announced only once the job had ended"
        stdout, _ = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0
    assert "rank 0: 61 passes, 60 steps" in stdout  # the job went on, untouched
    assert skews(json.loads((out / "report.json").read_text()))
