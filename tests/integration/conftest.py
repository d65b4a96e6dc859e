"""Run real multi-process gloo jobs under the doctor (torchrun, on CPU)."""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from nccl_doctor.diagnosis import Diagnosis
from nccl_doctor.supervisor.supervisor import Supervisor



@dataclass
class JobRun:
    exit_status: int
    diagnosis: Diagnosis
    out: Path


def torchrun(nproc: int, *target: str) -> list[str]:
    return [sys.executable, "-m", "torch.distributed.run", "--standalone",
            f"--nproc-per-node={nproc}", *target]


@pytest.fixture
def run_job(tmp_path: Path):
    def run(nproc: int, *target: str, env: dict[str, str] | None = None) -> JobRun:
        import os

        out = tmp_path / "capture"
        environ = dict(os.environ, **(env or {}))
        result = Supervisor(torchrun(nproc, *target), out, environ=environ).run()
        assert result.analysis_error is None, result.analysis_error
        assert result.diagnosis is not None
        return JobRun(result.exit_status, result.diagnosis, out)

    return run



@pytest.fixture
def launch():
    """``launch(nproc, *target)``: the torchrun command line for a job."""
    return torchrun
