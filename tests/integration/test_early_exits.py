"""Ranks that raise before they join a process group (rank/early_exit.py): real torchrun jobs
under `nccl-doctor run`, each diagnosed live (report.json, the console) and again by
`nccl-doctor replay` from its directory - the same verdict and root cause."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from nccl_doctor.analysis.what.exited import HINT_EARLY, HINT_RENDEZVOUS
from nccl_doctor.capture.names import EARLY_EXIT_SUFFIX

pytestmark = pytest.mark.integration

JOBS = Path(__file__).parent / "jobs"
JOB = "raise_before_init.py"


def line_of(text: str) -> int:
    return next(i for i, line in enumerate((JOBS / JOB).read_text().splitlines(), 1)
                if text in line)


LINE = line_of('CONFIG["lr"]')  # the job's line that raises (KeyError: 'lr')
INIT_LINE = line_of("init_process_group(")  # where its ranks wait for each other
CLI = [sys.executable, "-m", "nccl_doctor"]


def doctor(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    """The CLI, run from the jobs' directory: reports name the job's line ``JOB:N``."""
    import os

    return subprocess.run([*CLI, *args], capture_output=True, text=True, timeout=240, cwd=JOBS,
                          env=dict(os.environ, **(env or {})))


def torchrun(out: Path, env: dict[str, str] | None = None) -> tuple[subprocess.CompletedProcess,
                                                                    dict]:
    proc = doctor("run", "--out", str(out), "--", sys.executable, "-m", "torch.distributed.run",
                  "--standalone", "--nproc-per-node=2", JOB, env=env)
    return proc, json.loads((out / "report.json").read_text())


def console(proc: subprocess.CompletedProcess) -> str:
    """What the console said, its lines joined as the terminal's width cut them."""
    return " ".join(proc.stderr.split())


def replayed(out: Path) -> dict:
    proc = doctor("replay", "--format", "json", str(out))
    return json.loads(proc.stdout)


def root(report: dict) -> dict:
    return next(f for f in report["findings"] if f["root_cause"])


def assert_replay_agrees(out: Path, live: dict) -> None:
    again = replayed(out)
    assert again["verdict"] == live["verdict"]
    assert root(again)["title"] == root(live)["title"]
    assert [(r["rank"], r["state"]) for r in again["ranks"]] == [
        (r["rank"], r["state"]) for r in live["ranks"]]


def test_every_rank_raising_before_init_is_the_root_cause(tmp_path):
    """Both ranks read a setting the config lacks before init_process_group: each is recorded
    (torchrun's own ChildFailedError is not: its agent is no rank), and the report says what
    they raised and where, not that nothing was recorded."""
    out = tmp_path / "o"
    proc, report = torchrun(out)
    assert proc.returncode == 1 and "ChildFailedError" in proc.stderr  # torchrun's, unchanged
    assert proc.stderr.count("KeyError: 'lr'") >= 2  # each rank's own traceback, unchanged
    title = f"ranks 0, 1 raised KeyError: 'lr' at {JOB}:{LINE} before joining a process group"
    assert f"ROOT CAUSE rank_exited: {title}" in console(proc)
    assert "no rank joined" not in proc.stderr  # the not-recorded note is not printed
    assert sorted(p.name.split(".")[0] for p in out.glob(f"*{EARLY_EXIT_SUFFIX}")) == [
        "rank00000", "rank00001"]  # the ranks only: never the launcher
    assert report["verdict"] == "crash" and report["world_size"] == 2
    cause = root(report)
    assert cause["kind"] == "rank_exited" and cause["title"] == title
    assert cause["callsite"] == f"{JOB}:{LINE}" and cause["hint"] == HINT_EARLY
    assert cause["ranks"] == [0, 1] and cause["evidence"]["before_joining"] is True
    assert [(r["rank"], r["state"]) for r in report["ranks"]] == [(0, "exception"),
                                                                  (1, "exception")]
    assert_replay_agrees(out, report)


def test_one_rank_raising_while_its_peer_waits_in_init_is_the_root_cause(tmp_path):
    """Rank 1 raises 3 s in, rank 0 waits for it in init_process_group: torchrun stops rank 0
    (SIGTERM: it leaves no record), the job ends at once, and rank 1 is the cause."""
    out = tmp_path / "o"
    start = time.monotonic()
    proc, report = torchrun(out, {"RAISERS": "1", "RAISE_AFTER": "3", "INIT_TIMEOUT": "20"})
    assert proc.returncode == 1 and time.monotonic() - start < 60  # before rank 0's timeout
    title = f"rank 1 raised KeyError: 'lr' at {JOB}:{LINE} before joining a process group"
    assert f"ROOT CAUSE rank_exited: {title}" in console(proc)
    assert report["verdict"] == "crash" and root(report)["title"] == title
    assert "rank 0 left no record" in root(report)["detail"]
    states = {r["rank"]: r["state"] for r in report["ranks"]}
    assert states == {0: "no_capture", 1: "exception"}
    assert_replay_agrees(out, report)


def test_a_rank_that_timed_out_in_init_says_so(tmp_path):
    """Rank 0 gives up in init_process_group (2 s) before rank 1, still setting up, raised:
    what rank 0 raised is recorded as a rendezvous that timed out, with where it waited."""
    out = tmp_path / "o"
    proc, report = torchrun(out, {"RAISERS": "1", "RAISE_AFTER": "15", "INIT_TIMEOUT": "2"})
    assert proc.returncode == 1
    cause = root(report)
    assert cause["ranks"] == [0] and cause["hint"] == HINT_RENDEZVOUS
    assert cause["evidence"]["in_init_process_group"] is True
    assert cause["title"].startswith("rank 0 raised ") and cause["title"].endswith(
        "before joining a process group")
    assert cause["callsite"] == f"{JOB}:{INIT_LINE}"
    assert_replay_agrees(out, report)


def test_a_single_python_process_raising_before_init_is_rank_0(tmp_path):
    """``python train.py`` with no launcher: it imported torch.distributed, so it is the job's
    one rank, and its error is the report's root cause."""
    out = tmp_path / "o"
    proc = doctor("run", "--out", str(out), "--", sys.executable, JOB)
    report = json.loads((out / "report.json").read_text())
    assert proc.returncode == 1
    title = f"rank 0 raised KeyError: 'lr' at {JOB}:{LINE} before joining a process group"
    assert f"ROOT CAUSE rank_exited: {title}" in console(proc)
    assert report["verdict"] == "crash" and report["world_size"] == 1
    assert_replay_agrees(out, report)


def test_a_program_without_torch_raising_is_not_a_rank(tmp_path):
    """A script that never imported torch is no rank of a distributed job: nothing is recorded,
    and the report says so (the job failed: a crash, with the not-recorded note)."""
    out = tmp_path / "o"
    proc = doctor("run", "--out", str(out), "--", sys.executable, "-c",
                  "config = {}\nconfig['lr']")
    report = json.loads((out / "report.json").read_text())
    assert proc.returncode == 1 and "KeyError: 'lr'" in proc.stderr
    assert list(out.glob(f"*{EARLY_EXIT_SUFFIX}")) == []
    assert report["verdict"] == "crash" and report["findings"] == []
    assert any("no rank joined a process group" in n for n in report["notes"])
