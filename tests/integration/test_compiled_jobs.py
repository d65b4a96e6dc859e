"""torch.compile's collectives (issue 40): real 2-rank gloo jobs whose step Inductor compiles on
CPU, recorded by each recording kernel, and a compiled step one rank runs once more diagnosed
at the user's line - live and in replay (tests/integration/jobs/functional.py). Their own file
and tier (``compile``: ``make test-all``): compiling takes 8-11 s a job on 2 cores; the other
functional-collective jobs are test_functional_jobs.py's, in the default tier."""

from __future__ import annotations

import pytest

from functional_kernels import KERNELS, kernel_env  # (this directory: on sys.path)
from test_branch_jobs import line_of, root_of
from test_functional_jobs import SCRIPT, calls, healthy, run

pytestmark = pytest.mark.integration


@pytest.mark.parametrize("kernel", KERNELS)
def test_a_healthy_compiled_job_is_ok_and_its_functional_calls_are_recorded(run_job, kernel):
    healthy("compile_healthy", *run(run_job, "compile_healthy", **kernel_env(kernel)))


def test_a_compiled_step_run_once_more_is_diagnosed_at_the_users_line(run_job):
    job, live, again = run(run_job, "compile_extra")
    for report in (live, again):
        assert report["verdict"] == "hang", report["findings"]
        root = root_of(report)
        assert root["kind"] == "collective_mismatch", root
        assert root["ranks"] == [1], root
        sides = {tuple(s["ranks"]): s for s in root["evidence"]["sides"]}
        assert sides[(1,)]["op"] == "all_reduce" and sides[(0,)]["op"] == "barrier", sides
        assert sides[(1,)]["your_line"].endswith(f":{line_of(SCRIPT, 'x = fn(x)')}"), sides
    df = calls(job.out)
    compiled = df[(df["source"] == "functional") & (df["rank"] == 1)]
    assert len(compiled) == 4, compiled  # every compiled call, Inductor's included
