"""The Slurm side's edges, without a cluster: which commands are srun, what a run outside an
allocation says, a federation key that cannot be read (the cluster itself: tests/upstream/
test_slurm.py)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from nccl_doctor import env
from nccl_doctor.errors import ExitStatus
from nccl_doctor.supervisor.slurm import allocation


@pytest.mark.parametrize("command, expected", [
    (["srun", "python", "train.py"], True),
    (["/usr/bin/srun", "-N2", "torchrun", "train.py"], True),
    (["env", "A=1", "srun", "python", "x.py"], True),
    (["torchrun", "--nproc-per-node", "2", "train.py"], False),
    (["python", "srun.py"], False),
    ([], False),
])
def test_which_commands_are_sruns(command, expected):
    assert allocation.is_srun(command) is expected


def _run(*args: str, **environ: str) -> subprocess.CompletedProcess:
    base = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}
    return subprocess.run([sys.executable, "-m", "nccl_doctor", "run", *args],
                          capture_output=True, text=True, timeout=120, env={**base, **environ})


def test_slurm_outside_an_allocation_is_a_usage_error_in_one_line(tmp_path):
    proc = _run("--out", str(tmp_path / "o"), "--slurm", "--", "true")
    assert proc.returncode == ExitStatus.USAGE, proc.stderr
    (line,) = proc.stderr.strip().splitlines()
    assert "--slurm: not inside a Slurm allocation" in line and "salloc" in line
    assert "Traceback" not in proc.stderr


def test_slurm_and_ray_together_are_refused(tmp_path):
    proc = _run("--out", str(tmp_path / "o"), "--slurm", "--ray", "--", "true")
    assert proc.returncode == ExitStatus.USAGE
    assert "--slurm and --ray" in proc.stderr and "Traceback" not in proc.stderr


def test_an_unreadable_key_file_is_a_usage_error_in_one_line(tmp_path):
    proc = _run("--out", str(tmp_path / "o"), "--", "true",
                **{env.FEDERATION_KEY_FILE: str(tmp_path / "no-such-key")})
    assert proc.returncode == ExitStatus.USAGE, proc.stderr
    (line,) = proc.stderr.strip().splitlines()
    assert env.FEDERATION_KEY_FILE in line and "no-such-key" in line and "readable" in line


def test_a_plain_srun_outside_an_allocation_runs_and_says_the_nodes_go_unwatched(tmp_path):
    """(``srun`` here is a stand-in script: no Slurm is needed to see what the doctor says.)"""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    fake = bin_dir / "srun"
    fake.write_text("#!/bin/sh\nexec \"$@\"\n")
    fake.chmod(0o755)
    proc = _run("--out", str(tmp_path / "o"), "--no-gpu", "--", str(fake), "true",
                PATH=f"{bin_dir}:{os.environ['PATH']}")
    assert proc.returncode == 0, proc.stderr
    assert "srun outside an allocation: the other nodes go unwatched" in proc.stderr
