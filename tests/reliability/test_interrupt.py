"""Ctrl-C during a stall: the report names the interrupt as the user's and diagnoses the job as
it was when it came - not the KeyboardInterrupt each rank then raised."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time

import pytest

from .conftest import CLI, JOBS, os, rank_pids, torchrun, wait_for

pytestmark = pytest.mark.integration


def test_an_interrupt_during_a_stall_names_the_stall_not_the_keyboardinterrupt(tmp_path):
    out = tmp_path / "cap"
    # rank 1 loads a batch for ten minutes while rank 0 waits in all_reduce #2; no watchdog, so
    # the user is the one who gives up first
    env = {**os.environ, "STEPS": "3", "SLOW_RANK": "1", "SLOW_SECONDS": "600", "PAUSE": "0.1"}
    proc = subprocess.Popen([*CLI, "run", "--no-watch", "--out", str(out), "--",
                             *torchrun(2, JOBS / "train_loop.py")], env=env, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        assert wait_for(lambda: len(rank_pids(out)) == 2, 60)
        time.sleep(4.0)  # rank 0 is in the all_reduce, rank 1 asleep
        proc.send_signal(signal.SIGINT)  # one Ctrl-C
        _, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    report = json.loads((out / "report.json").read_text())
    root = next(f for f in report["findings"] if f["root_cause"])
    assert root["kind"] == "missing_collective" and root["ranks"] == [1], root["title"]
    assert "KeyboardInterrupt" not in root["title"]
    assert not [f for f in report["findings"] if f["kind"] == "rank_exited"], report["findings"]
    assert report["verdict"] == "hang"
    # (the test sent it: its own pid, as the kernel told the doctor)
    assert report["notes"][0].startswith(f"interrupted by SIGINT from pid {os.getpid()} ("), \
        report["notes"]
    states = {r["rank"]: r["exit_detail"] for r in report["ranks"]}
    assert states == {0: "was interrupted (SIGINT by the user)",
                      1: "was interrupted (SIGINT by the user)"}, states
    assert "interrupted by SIGINT from pid" in err and "ROOT CAUSE missing_collective" in err
    replay = subprocess.run([*CLI, "replay", str(out), "--format", "json"], text=True,
                            capture_output=True, timeout=120)
    assert json.loads(replay.stdout)["findings"] == report["findings"]  # the same story offline


def test_a_healthy_job_a_signal_ends_reads_interrupted_with_who_sent_it(tmp_path):
    """A SIGTERM from another process (a scheduler, a kill) ends a healthy job: the verdict is
    "interrupted", never ok, a crash or a hang, and the report says who sent what and when."""
    out = tmp_path / "cap"
    env = {**os.environ, "STEPS": "400", "PAUSE": "0.05"}
    proc = subprocess.Popen([*CLI, "run", "--out", str(out), "--",
                             *torchrun(2, JOBS / "train_loop.py")], env=env, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        assert wait_for(lambda: len(rank_pids(out)) == 2, 60)
        time.sleep(2.0)  # the ranks are in their loop
        # the sender lives on a moment, as a scheduler's daemon does: its name is read
        sender = subprocess.Popen([sys.executable, "-c", "import os, sys, time; "
                                   f"os.kill({proc.pid}, 15); time.sleep(3)", "the-scheduler"])
        _, err = proc.communicate(timeout=120)
        sender.wait(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    report = json.loads((out / "report.json").read_text())
    assert report["verdict"] == "interrupted", (report["verdict"], report["findings"])
    assert not [f for f in report["findings"] if f["severity"] == "error"], report["findings"]
    note = report["notes"][0]
    assert note.startswith(f"interrupted by SIGTERM from pid {sender.pid} ("), note
    assert "the-scheduler" in note and f"uid {os.getuid()})" in note
    assert "nccl-doctor: INTERRUPTED" in err
    replay = subprocess.run([*CLI, "replay", str(out), "--format", "json"], text=True,
                            capture_output=True, timeout=120)
    assert json.loads(replay.stdout)["verdict"] == "interrupted"  # the same offline


def test_a_signal_landing_while_the_failure_is_noted_does_not_erase_it(tmp_path):
    """A second signal raised inside the excepthook used to cost the rank its exception note, and
    the rank then read as having exited cleanly (CI saw it with torchrun's forwarded Ctrl-C)."""
    out = tmp_path / "cap"
    job = JOBS.parent.parent / "reliability" / "jobs" / "second_interrupt.py"
    line = 1 + job.read_text().splitlines().index("        raise BatchError()")
    proc = subprocess.run([*CLI, "run", "--out", str(out), "--", *torchrun(2, job)],
                          text=True, capture_output=True, timeout=240)
    report = json.loads((out / "report.json").read_text())
    root = next(f for f in report["findings"] if f["root_cause"])
    assert root["kind"] == "rank_exited" and root["ranks"] == [1], root["title"]
    assert f"raised BatchError: bad batch 7 at tests/reliability/jobs/second_interrupt.py:{line}" in root["title"], root["title"]
    assert "exited cleanly" not in proc.stderr, proc.stderr[-3000:]
