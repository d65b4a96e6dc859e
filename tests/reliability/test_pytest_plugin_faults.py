"""The pytest plugin when one rank's test fails: a finding naming the rank, the exception and the
test's line (not a desync with the doctor's own teardown barrier), and a capture that outlives
pytest's rotating temporary directories."""

from __future__ import annotations

import os
import re
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


def pytest_run(where, *args: str, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "pytest", "-q", *args], cwd=where, text=True,
                          capture_output=True, timeout=300,
                          env=dict(os.environ, COLUMNS="400", **env))  # reasons not cut


def test_an_assertion_on_one_rank_is_that_ranks_finding_and_its_capture_is_kept(tmp_path):
    (tmp_path / "test_one_rank.py").write_text(TEST)
    line = 1 + TEST.splitlines().index('    assert dist.get_rank() != 1, "rank 1 disagrees"')
    proc = pytest_run(tmp_path)
    out = proc.stdout
    cause = ("rank_exited: rank 1 raised AssertionError: rank 1 disagrees at "
             f"test_one_rank.py:{line} while its peers still needed it")
    # a failed test as pytest's own: counted, and one line in the short summary (-rf, pytest's
    # default) with the root cause as its reason
    assert proc.returncode == 1 and re.search(r"\b1 failed\b", out), out[-3000:]
    assert "diagnosed" not in out.splitlines()[-1]
    assert f"FAILED test_one_rank.py::test_rank_1_disagrees - {cause}\n" in out, out[-3000:]
    assert f"ROOT CAUSE {cause}" in " ".join(out.split()), out[-4000:]
    assert "barrier" not in out.split("ROOT CAUSE")[1].splitlines()[0]
    assert out.count("ROOT CAUSE") == 1  # the diagnosis is printed once
    # the fix is the test's (no launcher to restart), naming where the other rank waited
    fix = " ".join(out.split("fix: ", 1)[1].split())
    assert fix.startswith("The assertion failed on rank 1: fix the test or the code under test; "
                          "the other ranks waited for it in all_reduce #2 (group 0) and failed "
                          "only because it was gone."), fix[:300]
    assert "max-restarts" not in out and "torchrun" not in out
    # each rank's traceback is the test's: no frame of nccl-doctor's worker or wrappers
    rank_1 = out[out.index("--- rank 1 ---"):]
    assert f'test_one_rank.py", line {line}, in test_rank_1_disagrees' in rank_1, rank_1[:2000]
    assert not re.search(r'File "[^"]*/nccl_doctor/', out), out[-4000:]
    kept = tmp_path / ".pytest_cache" / "d" / "nccl-doctor" / "test_one_rank.py_test_rank_1_disagrees"
    assert (kept / "manifest.json").is_file() and list(kept.glob("rank*.ndcap")), out[-2000:]
    assert "rank_exited" in (kept / "report.html").read_text()  # the page, as `run` writes it
    assert f"capture: {kept} (nccl-doctor replay it)" in out
    assert out.count("(nccl-doctor replay it)") == 1  # the capture named once
    # the ini twin of --nccl-doctor-keep, relative to the rootdir; the ranks started fresh
    # (no fork server) end the same way: the same failure, the same traceback
    (tmp_path / "pytest.ini").write_text("[pytest]\nnccl_doctor_keep = kept\n")
    again = pytest_run(tmp_path, "-p", "no:cacheprovider", NCCL_DOCTOR_FORK_SERVER="0")
    assert again.returncode == 1, again.stdout[-3000:]
    assert f"FAILED test_one_rank.py::test_rank_1_disagrees - {cause}\n" in again.stdout
    assert f'test_one_rank.py", line {line}, in test_rank_1_disagrees' in again.stdout
    assert not re.search(r'File "[^"]*/nccl_doctor/', again.stdout), again.stdout[-4000:]
    assert (tmp_path / "kept" / "test_one_rank.py_test_rank_1_disagrees" / "manifest.json").is_file()
