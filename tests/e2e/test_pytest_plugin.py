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


@pytest.mark.parametrize("n", [1, 4])
@pytest.mark.distributed(world_size=2, timeout=60)
def test_with_fixture_and_params(tmp_path, n):
    (tmp_path / f"rank{dist.get_rank()}").write_text(str(n))
    t = torch.tensor([float(n)])
    dist.all_reduce(t)
    assert t.item() == 2 * n
'''


@pytest.fixture
def outcome(pytester: pytest.Pytester):
    pytester.makepyfile(test_dist=TESTS)
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "-rA", timeout=600)
    return result


def test_plugin_diagnoses_and_passes(outcome):
    out = outcome.stdout.str()
    outcome.assert_outcomes(passed=3, failed=3)
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
    for name in ("test_clean", "test_with_fixture_and_params[1]",
                 "test_with_fixture_and_params[4]"):
        assert f"PASSED test_dist.py::{name}" in out
