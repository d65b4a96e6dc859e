"""A job its launcher restarted (torchrun ``--max-restarts``): each attempt captured apart and
diagnosed; the failure that cost the restart kept in the report, live and replayed.

torch's own gloo restarts are fragile: the second attempt runs to its end, or dies connecting
its ranks (``connectFullMesh``: "Connection refused"), or its ranks stay in init_process_group
for good. Each way the first attempt's failure is a finding of its own, and the verdict is the
second attempt's: ok, its rank's connection failure, or the hang called after --stuck-after."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

JOBS = Path(__file__).parent / "jobs"
CLI = [sys.executable, "-m", "nccl_doctor"]
RAISING_LINE = "jobs/restart_once.py:15"


def _restarted(out: Path) -> subprocess.CompletedProcess:
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone",
               "--nproc-per-node=2", "--max-restarts=1", str(JOBS / "restart_once.py")]
    return subprocess.run([*CLI, "run", "--stuck-after", "10", "--out", str(out), "--", *command],
                          capture_output=True, text=True, timeout=300, env=dict(os.environ))


def _check(report: dict) -> None:
    first, second = report["attempts"]
    assert (first["number"], first["restart"], second["number"], second["restart"]) == (1, 0, 2, 1)
    assert first["verdict"] == "crash" and "bad batch in the first attempt" in first["summary"]
    earlier = [f for f in report["findings"] if f.get("attempt") == 1]
    assert len(earlier) == 1 and not earlier[0]["root_cause"]
    assert earlier[0]["kind"] == "rank_exited" and earlier[0]["ranks"] == [1]
    assert earlier[0]["callsite"].endswith(RAISING_LINE)
    assert earlier[0]["title"].startswith("attempt 1: rank 1 raised ValueError")
    # the verdict is the second attempt's: never a rank of the first beside one of the second
    assert not any("several captures" in n for n in report["notes"])
    assert any("launched 2 times" in n and "attempt 2's" in n for n in report["notes"])
    if report["verdict"] == "ok":
        assert second["summary"] == "no problem found"
        assert {r["state"] for r in report["ranks"]} == {"exited"}
        assert [f for f in report["findings"] if f["severity"] == "error"] == earlier
    else:
        root = next(f for f in report["findings"] if f["root_cause"])
        assert root.get("attempt") is None
        if report["verdict"] == "crash":  # the restart died connecting its ranks: to what
            assert root["kind"] == "rank_exited"
            assert "failed connecting to" in root["title"] and "connecting to 127.0.0.1:" in \
                root["title"]
        else:  # its ranks stayed in init_process_group: called, and stopped
            assert report["verdict"] == "hang" and root["kind"] == "blocked_wait"
            assert "the whole world joined and none returned" in root["title"] or \
                "the launcher has run on without them" in root["title"]


def test_a_restarted_job_keeps_each_attempt_s_failure_live_and_replayed(tmp_path):
    out = tmp_path / "out"
    run = _restarted(out)
    report = json.loads((out / "report.json").read_text())
    _check(report)
    assert "attempt 1: rank 1 raised ValueError" in run.stderr  # the console says it too
    replayed = subprocess.run([*CLI, "replay", str(out), "--format", "json"],
                              capture_output=True, text=True, timeout=300)
    again = json.loads(replayed.stdout)
    _check(again)
    assert again["attempts"] == report["attempts"] and again["verdict"] == report["verdict"]
    import nccl_doctor

    job = nccl_doctor.open(out)
    d = job.diagnose()
    assert [a.number for a in d.attempts] == [1, 2]
    assert [f.attempt for f in d.findings if f.attempt is not None] == [1]


def test_on_hang_restart_ends_the_hung_ranks_and_the_launcher_starts_them_again(tmp_path):
    """``--on-hang restart`` under torchrun ``--max-restarts 1``: the first attempt's deadlock
    is called and its ranks ended, not the job; the launcher starts them again, and the report
    keeps the first attempt's hang while its verdict is the second attempt's."""
    out = tmp_path / "out"
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone",
               "--nproc-per-node=2", "--max-restarts=1", str(JOBS / "hang_once.py")]
    run = subprocess.run([*CLI, "run", "--on-hang", "restart", "--stuck-after", "10", "--out",
                          str(out), "--", *command], capture_output=True, text=True,
                         timeout=300, env=dict(os.environ))
    assert "ending the hung ranks for their launcher to restart them" in run.stderr
    report = json.loads((out / "report.json").read_text())
    first, second = report["attempts"]
    assert first["verdict"] == "hang" and "ops differ" in first["summary"]
    earlier = [f for f in report["findings"] if f.get("attempt") == 1]
    assert [f["kind"] for f in earlier] == ["collective_mismatch"]
    assert earlier[0]["callsite"].endswith("jobs/hang_once.py:15")  # rank 1's all_reduce
    root = next((f for f in report["findings"] if f["root_cause"]), None)
    assert root is None or root.get("attempt") is None  # never the first attempt's hang
    assert report["verdict"] == second["verdict"]
    if second["verdict"] == "ok":  # (torch's gloo restart may also fail to connect its ranks)
        assert run.returncode == 0 and root is None
    replayed = json.loads(subprocess.run([*CLI, "replay", str(out), "--format", "json"],
                                         capture_output=True, text=True, timeout=300).stdout)
    assert replayed["attempts"] == report["attempts"]


def test_a_slurm_requeue_into_the_same_out_keeps_the_earlier_launch_as_its_attempt(tmp_path):
    """A batch script run again by its requeue (the same SLURM_JOB_ID, SLURM_RESTART_COUNT one
    higher) with the same --out: the earlier launch's captures stay, no --force asked, and the
    report lists both launches, the first one's failure kept. (Slurm's own requeue is run by
    the slurm tier; here its environment is given as slurmd gives it.)"""
    out = tmp_path / "out"
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone",
               "--nproc-per-node=2", str(JOBS / "requeued_once.py")]
    runs = []
    for requeues in (0, 1):
        env = dict(os.environ, SLURM_JOB_ID="4242", SLURM_RESTART_COUNT=str(requeues))
        runs.append(subprocess.run([*CLI, "run", "--out", str(out), "--", *command],
                                   capture_output=True, text=True, timeout=300, env=env))
    assert [r.returncode for r in runs] == [1, 0], runs[1].stderr[-2000:]
    report = json.loads((out / "report.json").read_text())
    assert report["verdict"] == "ok"
    first, second = report["attempts"]
    assert (first["requeue"], first["verdict"], second["requeue"], second["verdict"]) == \
        (0, "crash", 1, "ok")
    assert "node lost its data mount" in first["summary"]
    assert "SUSPECT" not in runs[1].stderr  # the earlier launch's ranks were never watched again
    # another job's launch (not this job's requeue): its --out is refused as before
    again = subprocess.run([*CLI, "run", "--out", str(out), "--", *command],
                           capture_output=True, text=True, timeout=300,
                           env=dict(os.environ, SLURM_JOB_ID="9999", SLURM_RESTART_COUNT="1"))
    assert again.returncode != 0 and "is not empty" in again.stderr
