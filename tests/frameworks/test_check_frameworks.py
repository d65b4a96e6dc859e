"""Issue 51 in the frameworks' own environment (Lightning, DeepSpeed, accelerate, transformers
at the tier's releases): ``nccl-doctor check`` finds every hang of the tier's jobs before the
run - the branch on the rank test_frameworks.py's runs name, at its line, and DeepSpeed's
``generate`` without ``synced_gpus`` - and on Lightning's and DeepSpeed's own installed sources
stays under one false finding per 50,000 lines (docs/check.md triages each)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from envs import FRAMEWORKS, FRAMEWORKS_BUILD, python_for
from test_frameworks import JOBS, RANK_BRANCHES, line_of

pytestmark = [pytest.mark.frameworks, pytest.mark.timeout(1800)]
PER_FALSE = 50_000  # lines per false finding allowed (docs/check.md)


@pytest.fixture(scope="module")
def site() -> Path:
    """The frameworks environment's own site-packages (Lightning, DeepSpeed, ... at the tier's
    releases): put on the path of this interpreter's ``check``, whose catalog then reads their
    versions there (the environment's python does not run the editable install's finder)."""
    python = python_for("frameworks", FRAMEWORKS, **FRAMEWORKS_BUILD)
    return Path(subprocess.run(
        [str(python), "-c", "import lightning, os; print(os.path.dirname(os.path.dirname("
                            "lightning.__file__)))"], capture_output=True, text=True,
        check=True).stdout.strip())


def check(site: Path, *args: str) -> dict:
    proc = subprocess.run([sys.executable, "-m", "nccl_doctor", "check", "--format", "json",
                           *args], capture_output=True, text=True, timeout=900,
                          env={**os.environ, "PYTHONPATH": str(site)})
    assert proc.returncode in (0, 1), proc.stderr[-2000:]
    return json.loads(proc.stdout)


def test_every_hang_of_the_tiers_jobs_is_found_before_the_run(site):
    report = check(site, str(JOBS))
    found = {(Path(f["path"]).name, f["condition"]["line"], f["code"]) for f in report["findings"]}
    for case in {(c.job, c.branch) for c in RANK_BRANCHES}:
        job, branch = case
        assert (job, line_of(job, branch), "ND004") in found, (case, found)
    generate = line_of("ds_generate.py", "out = engine.module.generate")
    (ds,) = [f for f in report["findings"] if f["path"].endswith("ds_generate.py")]
    assert (ds["code"], ds["line"]) == ("ND005", generate), ds
    assert "unless --fixed is given" in ds["message"], ds["message"]
    assert len(report["findings"]) == len({(c.job, c.branch) for c in RANK_BRANCHES}) + 1, found


def test_lightning_and_deepspeed_sources_stay_under_the_goal(site):
    roots = [site / "lightning", site / "deepspeed"]
    lines = sum(len(p.read_bytes().splitlines()) for r in roots for p in r.rglob("*.py"))
    report = check(site, *map(str, roots))
    assert report["files"] > 500 and lines > 150_000, (report["files"], lines)
    found = [f"{f['path']}:{f['line']} {f['code']}" for f in report["findings"]]
    assert len(found) <= lines // PER_FALSE, (lines, found)
