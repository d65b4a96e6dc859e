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
        assert_window_agrees(out)
        return JobRun(result.exit_status, result.diagnosis, out)

    return run



def assert_window_agrees(out: Path) -> None:
    """Replayed with a window forced (capture/window.py: a few records around each group's
    first divergence and each rank's newest ones, as a large job is replayed), the job's report
    says what it says on every record: the same findings and ranks (only the straggler pass,
    which reads timing over the whole run, and the window's own note may differ)."""
    from nccl_doctor.analysis import analyze
    from nccl_doctor.capture import directory

    def report(**window) -> dict:
        d = analyze(directory.load_capture_dir(out, **window)).to_json()
        stragglers = [f for f in d["findings"] if f["kind"] == "straggler"]
        d["findings"] = [f for f in d["findings"] if f not in stragglers]
        d["notes"] = [n for n in d["notes"] if "records compared across" not in n]
        if stragglers:
            d.pop("root_cause", None)
            d.pop("verdict", None)
        return d

    full = report()
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(directory, "WINDOW_TAILS", 0)
        mp.setattr(directory, "TAIL", 8)
        windowed = report(window_above=0)
    if "verdict" not in full:  # (a straggler warning: the window may keep too little to see it)
        windowed.pop("verdict", None)
        windowed.pop("root_cause", None)
    assert windowed == full


@pytest.fixture
def launch():
    """``launch(nproc, *target)``: the torchrun command line for a job."""
    return torchrun
