"""Ray, the real thing (Ray Train's TorchTrainer and plain actors, CPU, gloo), under
`nccl-doctor run` exactly as a user wraps a driver: the collective runs on Ray Train's
TrainingThread, the workers end without atexit, an exception is kept by Ray, not raised."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import uuid
from pathlib import Path

import psutil
import pytest

JOBS = Path(__file__).parent / "ray_jobs"
CLI = [sys.executable, "-m", "nccl_doctor"]
TAG = "NCCL_DOCTOR_TEST_JOB"  # names the processes of one test's job

pytestmark = pytest.mark.upstream  # one worker runs them (tests/conftest.py SHARED)


def run(job: str, out: Path, *args: str) -> tuple[subprocess.CompletedProcess, dict]:
    tag = uuid.uuid4().hex  # in the environment of every process this job starts, Ray's too
    proc = subprocess.run([*CLI, "run", "--out", str(out), "--", sys.executable,
                           str(JOBS / job), *args], capture_output=True, text=True, timeout=280,
                          env=dict(os.environ, **{TAG: tag}))
    assert_no_ray_left(tag)
    report = json.loads((out / "report.json").read_text())
    replay = subprocess.run([*CLI, "replay", "--format", "json", str(out)], capture_output=True,
                            text=True, timeout=120)
    assert replay.returncode == 0, replay.stderr[-2000:]
    again = json.loads(replay.stdout)
    assert again["verdict"] == report["verdict"]
    assert [(f["kind"], f["ranks"], f["callsite"]) for f in again["findings"]] == \
        [(f["kind"], f["ranks"], f["callsite"]) for f in report["findings"]]
    return proc, report


def assert_no_ray_left(tag: str, wait: float = 15.0) -> None:
    """No process of Ray's (raylet, gcs_server, workers, whatever their titles say) started by
    the job outlives it: the processes whose environment carries the job's ``tag``."""
    def ours() -> list[str]:
        found = []
        for p in psutil.process_iter(["cmdline"]):
            try:
                if p.environ().get(TAG) == tag and p.status() != psutil.STATUS_ZOMBIE:
                    found.append(f"{p.pid} {' '.join(p.info['cmdline'] or [])[:120]}")
            except psutil.Error:  # gone meanwhile, or not ours to read
                continue
        return found

    deadline = time.time() + wait
    while ours() and time.time() < deadline:
        time.sleep(0.5)
    assert not ours(), ours()


def test_a_healthy_ray_train_job_reads_ok(tmp_path):
    proc, report = run("ray_train_healthy.py", tmp_path / "out")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert report["verdict"] == "ok" and report["findings"] == [], report["findings"]
    assert report["world_size"] == 2 and report["notes"] == [n for n in report["notes"]
                                                              if "GPUs not sampled" in n]
    # Ray ends its workers without atexit: no exit record, but their work had finished
    assert [r["state"] for r in report["ranks"]] == ["finished", "finished"]


def test_a_skipped_broadcast_under_ray_train_names_the_line_and_the_training_thread(tmp_path):
    proc, report = run("ray_train_skip_broadcast.py", tmp_path / "out")
    assert proc.returncode == 124, proc.stderr[-3000:]
    assert report["verdict"] == "hang"
    root = next(f for f in report["findings"] if f["root_cause"])
    assert root["kind"] == "collective_mismatch" and root["op"] in ("broadcast", "barrier")
    sides = {tuple(s["ranks"]): s for s in root["evidence"]["sides"]}
    assert sides[(0,)]["op"] == "broadcast" and sides[(1,)]["op"] == "barrier"
    assert all("ray_train_skip_broadcast.py:" in s["callsite"] for s in sides.values())
    assert "known_issue" not in root["evidence"]
    for r in report["ranks"]:  # the collective's thread, and the main one beside it
        assert "ray_train_skip_broadcast.py" in r["stack_summary"], r
        assert "on thread 'TrainingThread" in r["stack_summary"], r
        assert "main thread at" in r["stack_summary"] and "main_loop" in r["stack_summary"]
    for c in report["stack_classes"]:
        assert "train_func" in " ".join(c["frames"]), c
        assert not c["frames"][-1].endswith("main_loop"), c


def test_an_exception_ray_train_keeps_is_the_root_cause(tmp_path):
    proc, report = run("ray_train_raises.py", tmp_path / "out")
    assert proc.returncode == 1, proc.stderr[-3000:]
    assert report["verdict"] == "crash"
    root = next(f for f in report["findings"] if f["root_cause"])
    assert root["kind"] == "rank_exited" and root["ranks"] == [1], root
    assert "RuntimeError" in root["title"] and "ray_train_raises.py:" in root["callsite"]


def test_two_ray_actors_out_of_step_are_a_mismatch_not_a_known_issue(tmp_path):
    proc, report = run("ray_actors.py", tmp_path / "out", "--mismatch")
    assert proc.returncode == 124, proc.stderr[-3000:]
    root = next(f for f in report["findings"] if f["root_cause"])
    assert root["kind"] == "collective_mismatch" and root["evidence"]["aspect"] == "op"
    assert {s["op"] for s in root["evidence"]["sides"]} == {"all_reduce", "all_gather"}
    assert all("ray_actors.py:" in s["callsite"] for s in root["evidence"]["sides"])
    # an all_gather of small vectors against an all_reduce: not per-rank-padded logits (A)
    assert "known_issue" not in root["evidence"]
    assert all("ray_actors.py" in r["stack_summary"] for r in report["ranks"])


def test_healthy_ray_actors_read_ok(tmp_path):
    proc, report = run("ray_actors.py", tmp_path / "out")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert report["verdict"] == "ok" and report["findings"] == []
    # Ray ends an actor's worker either way: killed after its work (no exit record: finished)
    # or, under load, by its own exit (atexit ran: exited cleanly); both are healthy ends
    assert {r["state"] for r in report["ranks"]} <= {"finished", "exited"}, report["ranks"]
    assert all(r["exit_detail"] in ("finished (no exit record)", "exited cleanly")
               for r in report["ranks"]), report["ranks"]
