"""How the doctor stops a job it diagnosed as hung (``--on-hang kill``): it asks each rank's
agent to exit, so torchrun ends by itself - no ``SignalException`` traceback under the diagnosis,
no restart - and what the ranks had printed but not flushed still reaches the user. A rank that
handles SIGTERM itself gets SIGTERM, as before."""

from __future__ import annotations

import html
import json
import subprocess
from pathlib import Path

import pytest

from nccl_doctor.errors import ExitStatus

from .conftest import CLI, os, torchrun

pytestmark = pytest.mark.integration

JOB = Path(__file__).parent / "jobs" / "stop_hang.py"


def run_hang(tmp_path: Path, **env: str) -> tuple[subprocess.CompletedProcess, dict, list]:
    out = tmp_path / "cap"
    proc = subprocess.run([*CLI, "run", "--out", str(out), "--", *torchrun(2, JOB)],
                          capture_output=True, text=True, timeout=240,
                          env={**os.environ, **env})
    report = json.loads((out / "report.json").read_text())
    events = json.loads((out / "watchdog.json").read_text())["events"]
    stops = [s for e in events if e["event"] == "stop" for s in e["signals"]]
    return proc, report, stops


def test_a_hung_job_is_asked_to_exit_and_torchrun_ends_without_a_traceback(tmp_path):
    proc, report, stops = run_hang(tmp_path)
    assert proc.returncode == ExitStatus.HANG_STOPPED, proc.stderr[-3000:]
    assert stops == ["exit request"], stops
    for noise in ("Traceback", "SignalException", "ChildFailedError"):
        assert noise not in proc.stderr and noise not in proc.stdout, proc.stderr[-3000:]
    assert "rank 0: last words before the hang" in proc.stdout, proc.stdout  # flushed on exit
    assert "rank 1: last words before the hang" in proc.stdout, proc.stdout
    details = {r["rank"]: r["exit_detail"] for r in report["ranks"]}
    assert details == {r: "was stopped by nccl-doctor (exit request) after the hang was "
                          "diagnosed" for r in (0, 1)}, details
    assert "ROOT CAUSE collective_mismatch" in proc.stderr
    # the page beside report.json: the same root cause, and where run said it wrote it
    page = (tmp_path / "cap" / "report.html").read_text()
    assert html.escape(report["findings"][0]["title"], quote=False) in page
    assert f"and {tmp_path / 'cap' / 'report.html'}" in proc.stderr


def test_a_rank_that_handles_sigterm_itself_is_sent_sigterm(tmp_path):
    proc, report, stops = run_hang(tmp_path, HANDLER_RANK="1")
    assert proc.returncode == ExitStatus.HANG_STOPPED, proc.stderr[-3000:]
    assert stops[:1] == ["SIGTERM"], stops  # the job's own way to stop, not an exit request
    assert all(r["state"] == "stopped" for r in report["ranks"]), report["ranks"]
    assert report["findings"][0]["kind"] == "collective_mismatch"
