"""The console report of a real hung job, through the CLI with stdout a pipe: at COLUMNS 60, 80,
120 and 200 every line fits, no ``path:line`` is cut across lines, a headline ends between its
phrases and a rank keeps one row; with no COLUMNS (a log file) no line is wrapped at all. Paths
are short: the job's own file relative to the working directory, torch's from its package root."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest
from rich.cells import cell_len

from .conftest import CLI, JOBS, spawn_command



@pytest.fixture(scope="module")
def hung(tmp_path_factory) -> tuple[Path, Path, str]:
    """(the working directory holding the job's train.py, the capture of its hang, the run's
    stderr at COLUMNS=80): 3 ranks, rank 1 skips a broadcast; the watchdog calls the hang."""
    cwd = tmp_path_factory.mktemp("width")
    shutil.copy(JOBS / "skip_broadcast.py", cwd / "train.py")
    out = cwd / "cap"
    env = dict(os.environ, SKIPPER="1", COLUMNS="80")
    proc = subprocess.run([*CLI, "run", "--out", str(out), "--",
                           *spawn_command(3, ["train.py"])], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=240)
    assert proc.returncode == 124, proc.stderr[-3000:]
    return cwd, out, proc.stderr


def replay(cwd: Path, out: Path, columns: int | None, *args: str) -> str:
    env = {k: v for k, v in os.environ.items() if k != "COLUMNS"}
    if columns is not None:
        env["COLUMNS"] = str(columns)
    proc = subprocess.run([*CLI, "replay", *args, str(out)], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=120)  # stdout: a pipe
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc.stdout








@pytest.mark.parametrize("columns", [60, 80, 120, 200])
def test_replay_fits_columns_through_a_pipe(hung, columns, fit):
    cwd, out, _ = hung
    text = replay(cwd, out, columns)
    whole = replay(cwd, out, None)
    lines = text.splitlines()
    assert max(cell_len(line) for line in lines) <= columns, text
    # no path:line cut across lines: the same places as in the unwrapped report, each whole
    assert fit.sites(text) == fit.sites(whole) and "train.py:19" in fit.sites(text), text
    report = json.loads(replay(cwd, out, None, "--format", "json"))
    root = next(f for f in report["findings"] if f["root_cause"])
    title = fit.headline(lines, "ROOT CAUSE ")
    assert " ".join(title) == f"ROOT CAUSE {root['kind']}: {root['title']}", text
    verdict = fit.headline(lines, "nccl-doctor: HANG")
    assert " ".join(verdict) == "nccl-doctor: HANG - the job is hung (3 ranks, exit status 124)"
    for shown in (title, verdict):
        for before, after in zip(shown, shown[1:]):
            assert fit.between_phrases(before, after), shown
    # each rank on one row, its state one word; how they ended said once, the verb agreeing
    for r in report["ranks"]:
        row = next(line for line in lines if line.startswith(f"{r['rank']}  "))
        assert row.split()[1:4] == [r["host"], str(r["pid"]), "stopped"], row
    assert " ".join(" ".join(lines).split()).count(
        "ranks 0-2: were stopped by nccl-doctor (exit request) after the hang was diagnosed") == 1


def test_replay_to_a_pipe_wraps_nothing(hung):
    cwd, out, _ = hung
    text = replay(cwd, out, None)
    report = json.loads(replay(cwd, out, None, "--format", "json"))
    root = next(f for f in report["findings"] if f["root_cause"])
    assert f"ROOT CAUSE {root['kind']}: {root['title']}\n" in text
    assert f"    fix: {root['hint']}\n" in text
    lines = text.splitlines()
    header = next(line for line in lines if line.startswith("rank  host"))
    assert header.endswith("stack (innermost user frame)")
    # short paths: the job's file relative to here, torch's from its package root
    assert "torch/distributed/distributed_c10d.py:" in text and "site-packages" not in text
    assert str(cwd) not in text


def test_the_runs_own_summary_fits_columns(hung):
    """``run`` prints its summary on stderr (a pipe here) laid out for COLUMNS=80."""
    _, _, stderr = hung
    lines = stderr.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("nccl-doctor: HANG - "))
    summary = lines[start:-1]  # up to "Wrote ...", a path (not laid out)
    assert max(cell_len(line) for line in summary) <= 80, "\n".join(summary)
    assert lines[-1].startswith("Wrote ")
