"""The pytest plugin when one rank's test fails: a finding naming the rank, the exception and the
test's line (not a desync with the doctor's own teardown barrier), and a capture that outlives
pytest's rotating temporary directories."""

from __future__ import annotations

import subprocess
import sys

import pytest

pytestmark = pytest.mark.integration

TEST = '''
import pytest
import torch
import torch.distributed as dist


@pytest.mark.distributed(world_size=2, timeout=60)
def test_rank_1_disagrees():
    t = torch.ones(2)
    dist.all_reduce(t)
    assert dist.get_rank() != 1, "rank 1 disagrees"
    dist.all_reduce(t)
'''


def pytest_run(where, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "pytest", "-q", *args], cwd=where, text=True,
                          capture_output=True, timeout=300)


def test_an_assertion_on_one_rank_is_that_ranks_finding_and_its_capture_is_kept(tmp_path):
    (tmp_path / "test_one_rank.py").write_text(TEST)
    line = 1 + TEST.splitlines().index('    assert dist.get_rank() != 1, "rank 1 disagrees"')
    proc = pytest_run(tmp_path)
    out = proc.stdout
    assert proc.returncode == 1 and "1 diagnosed" in out, out[-3000:]
    assert ("ROOT CAUSE rank_exited: rank 1 raised AssertionError: rank 1 disagrees at "
            f"test_one_rank.py:{line}") in out, out[-4000:]
    assert "barrier" not in out.split("ROOT CAUSE")[1].splitlines()[0]
    assert out.count("ROOT CAUSE") == 1  # the diagnosis is printed once
    kept = tmp_path / ".pytest_cache" / "d" / "nccl-doctor" / "test_one_rank.py_test_rank_1_disagrees"
    assert (kept / "manifest.json").is_file() and list(kept.glob("rank*.ndcap")), out[-2000:]
    assert "rank_exited" in (kept / "report.html").read_text()  # the page, as `run` writes it
    assert f"capture: {kept} (nccl-doctor replay it)" in out
    # the ini twin of --nccl-doctor-keep, relative to the rootdir
    (tmp_path / "pytest.ini").write_text("[pytest]\nnccl_doctor_keep = kept\n")
    again = pytest_run(tmp_path, "-p", "no:cacheprovider")
    assert again.returncode == 1, again.stdout[-3000:]
    assert (tmp_path / "kept" / "test_one_rank.py_test_rank_1_disagrees" / "manifest.json").is_file()
