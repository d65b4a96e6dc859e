from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from nccl_doctor.testing.spawn import command as spawn_command

CLI = [sys.executable, "-m", "nccl_doctor"]
JOBS = Path(__file__).parent.parent / "integration" / "jobs"


def doctor(*args: str, timeout: float = 240, **kwargs) -> subprocess.CompletedProcess:
    return subprocess.run([*CLI, *args], capture_output=True, text=True, timeout=timeout, **kwargs)


@pytest.fixture(scope="session")
def clean_capture(tmp_path_factory) -> Path:
    """A real 2-rank capture of a healthy job, made once; copy it before changing it."""
    out = tmp_path_factory.mktemp("clean") / "cap"
    proc = doctor("run", "--quiet", "--out", str(out), "--",
                  *spawn_command(2, [str(JOBS / "clean.py")]))
    assert proc.returncode == 0, proc.stderr[-3000:]
    return out


@pytest.fixture
def capture_copy(clean_capture: Path, tmp_path: Path) -> Path:
    dst = tmp_path / "copy"
    shutil.copytree(clean_capture, dst)
    return dst


__all__ = ["CLI", "doctor", "os", "spawn_command"]
