"""The pytest plugin, through pytester: distributed tests that deadlock, mismatch, fail on one
rank or pass, run as a user's test suite would."""

from __future__ import annotations

import pytest

pytest_plugins = ["pytester"]
pytestmark = pytest.mark.integration

TESTS = '''
import pytest
import torch
import torch.distributed as dist


@pytest.mark.distributed(world_size=2, timeout=60)
def test_clean():
    t = torch.ones(3) * (dist.get_rank() + 1)
    dist.all_reduce(t)
    assert t.tolist() == [3.0, 3.0, 3.0]


@pytest.mark.distributed(world_size=3, timeout=60)
def test_deadlock():
    t = torch.ones(4)
    dist.all_reduce(t)
    if dist.get_rank() != 2:  # rank 2 skips the broadcast
        dist.broadcast(t, src=0)
    dist.all_reduce(t)


@pytest.mark.distributed(world_size=2, timeout=60)
def test_shapes():
    t = torch.ones(2, 5 + dist.get_rank())
    out = [torch.empty_like(t) for _ in range(2)]
    dist.all_gather(out, t)


@pytest.mark.distributed(world_size=2, timeout=60)
def test_assert_on_rank_1():
    assert dist.get_rank() != 1, "rank 1 disagrees"


@pytest.mark.distributed(world_size=2, timeout=60)
def test_collectives_fixture(collectives):
    dist.all_reduce(torch.ones(1))
    dist.broadcast(torch.ones(1), src=0)
    dist.barrier()
    assert collectives.ops() == ["all_reduce", "broadcast", "barrier"]
    assert collectives.counts()["broadcast"] == 1
    assert collectives.by_rank() == {0: collectives.ops(), 1: collectives.ops()}
    collectives.assert_no_desync()


@pytest.mark.parametrize("n", [1, 4])
@pytest.mark.distributed(world_size=2, timeout=60)
def test_with_fixture_and_params(tmp_path, n):
    (tmp_path / f"rank{dist.get_rank()}").write_text(str(n))
    t = torch.tensor([float(n)])
    dist.all_reduce(t)
    assert t.item() == 2 * n
'''


@pytest.fixture(params=["serial", "xdist"])
def outcome(pytester: pytest.Pytester, request):
    pytester.makepyfile(test_dist=TESTS)
    extra = ["-p", "xdist", "-n", "2"] if request.param == "xdist" else []
    return pytester.runpytest_subprocess("-p", "no:cacheprovider", "-rA", *extra, timeout=600)


def test_plugin_diagnoses_and_passes(outcome):
    out = outcome.stdout.str()
    counts = outcome.parseoutcomes()
    assert counts.get("passed") == 4, out[-3000:]
    # the deadlock and the shape mismatch are failures the doctor diagnosed: letter D
    assert counts.get("diagnosed", 0) + counts.get("failed", 0) == 3, counts
    assert counts.get("diagnosed", 0) >= 2 and outcome.ret == pytest.ExitCode.TESTS_FAILED
    # a deadlock fails within its timeout, naming the rank that skipped the broadcast
    deadlock = out[out.index("_ test_deadlock _"):]
    assert "ROOT CAUSE" in deadlock and "rank 2" in deadlock
    assert "broadcast" in deadlock and "test_dist.py:" in deadlock
    # a shape mismatch names both shapes
    shapes = out[out.index("_ test_shapes _"):]
    assert "float32[2,5]" in shapes and "float32[2,6]" in shapes
    # an assertion on one rank shows that rank's traceback, and only that rank's
    start = out.index("_ test_assert_on_rank_1 _")
    failed_rank = out[start:out.index("Captured nccl-doctor call", start)]
    assert "--- rank 1 ---" in failed_rank and "rank 1 disagrees" in failed_rank
    assert "--- rank 0 ---" not in failed_rank
    # each failure has its short nccl-doctor report section
    assert out.count("Captured nccl-doctor call") == 3
    for name in ("test_clean", "test_collectives_fixture", "test_with_fixture_and_params[1]",
                 "test_with_fixture_and_params[4]"):
        assert f"PASSED test_dist.py::{name}" in out
    diagnoses = out[out.index("= nccl-doctor diagnoses ="):]
    assert "_ test_deadlock _" in diagnoses and "_ test_shapes _" in diagnoses


LAUNCHING = '''
import os, subprocess, sys

def test_launches_a_hanging_job():
    proc = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone",
                           "--nproc-per-node=3", JOB], env=dict(os.environ, SKIPPER="1"),
                          timeout=240)
    assert proc.returncode == 0

def test_launches_a_clean_job():
    proc = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone",
                           "--nproc-per-node=2", CLEAN], timeout=240)
    assert proc.returncode == 0
'''


def test_nccl_doctor_option_catches_a_hanging_torchrun(pytester: pytest.Pytester):
    from pathlib import Path

    jobs = Path(__file__).parent.parent / "integration" / "jobs"
    pytester.makepyfile(test_launch=f"JOB = {str(jobs / 'skip_broadcast.py')!r}\n"
                                    f"CLEAN = {str(jobs / 'clean.py')!r}\n" + LAUNCHING)
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "-rA", "--nccl-doctor",
                                           timeout=600)
    out = result.stdout.str()
    counts = result.parseoutcomes()
    assert counts.get("passed") == 1 and counts.get("diagnosed") == 1, out[-3000:]
    hang = out[out.index("_ test_launches_a_hanging_job _"):]
    assert "a job this test launched hung" in hang and "ROOT CAUSE" in hang
    assert "skip_broadcast.py" in hang and "rank 1" in hang
    assert hang.count("ROOT CAUSE") == 1  # the diagnosis once; the section only names the capture
    assert "hang: " in hang and "(nccl-doctor replay it)" in hang
    # without the option the plugin leaves subprocesses alone (the hang would block): the ini
    # switch is read too
    pytester.makeini("[pytest]\nnccl_doctor = true\n")
    again = pytester.runpytest_subprocess("-p", "no:cacheprovider", "-k", "clean", timeout=600)
    assert again.parseoutcomes().get("passed") == 1
