"""Every verdict but ok has a root cause (issue 50): a real 2-rank gloo job whose ranks all
fail inside the same collective (tests/integration/jobs/failed_together.py) reads crash with
the first error as its root cause - its rank, its call, its line - and what the ranks passed
to that call differently, live and replayed."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.integration.test_branch_jobs import line_of, replayed, root_of

pytestmark = pytest.mark.integration

SCRIPT = Path(__file__).parent / "jobs" / "failed_together.py"


def test_ranks_that_all_fail_in_one_call_have_the_first_error_as_root_cause(run_job):
    job = run_job(2, str(SCRIPT))
    assert job.exit_status != 0
    line = line_of(SCRIPT, "dist.all_gather_into_tensor(out, x)")
    for report in (json.loads((job.out / "report.json").read_text()), replayed(job.out)):
        assert report["verdict"] == "crash"
        root = root_of(report)
        assert root["kind"] == "rank_exited", root["title"]
        assert root["callsite"].endswith(f"{SCRIPT.name}:{line}"), root["callsite"]
        assert "in it too" in root["title"] and "RuntimeError" in root["title"], root["title"]
        assert root["evidence"]["failed_together"] == [0, 1]
        # the outputs each rank passed: float32[3] on rank 0, float32[4] on rank 1
        assert root["evidence"]["differs"]["output"] == {"float32[3]": [0], "float32[4]": [1]}
