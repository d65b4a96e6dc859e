"""Ctrl-C during a wait: the report names the interrupt as the user's and says what the ranks
were doing when it came - not the KeyboardInterrupt each rank then raised, and not a hang: only
the watchdog, which saw a wait go on, calls one."""

from __future__ import annotations

import json
import re
import signal
import subprocess
import sys
import time

import pytest

from pathlib import Path

from nccl_doctor.reproducers.nodes import free_port

from .conftest import CLI, JOBS, alive, os, rank_pids, torchrun, wait_for

pytestmark = pytest.mark.integration


def test_an_interrupt_during_a_wait_says_the_wait_not_the_keyboardinterrupt(tmp_path):
    out = tmp_path / "cap"
    # rank 1 loads a batch for ten minutes while rank 0 waits in all_reduce #1; no watchdog, so
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
    assert report["verdict"] == "interrupted", report["findings"]
    assert not [f for f in report["findings"] if f["severity"] == "error"], report["findings"]
    assert "KeyboardInterrupt" not in json.dumps(report["findings"])
    # (the test sent it: its own pid, as the kernel told the doctor)
    note = report["notes"][0]
    assert note.startswith(f"interrupted by you (SIGINT from pid {os.getpid()} ("), note
    line = f"train_loop.py:{_line('dist.all_reduce(t)')}"
    # (rank 1 loads its batch before each step's all_reduce: it never made one)
    assert re.search(r" after \d+\.\d s, at \d\d:\d\d:\d\d; at that moment rank 0 had "
                     rf"waited [34]\.\d\d s in all_reduce #1 \(group 0\) at \S*{line}; rank 1 "
                     r"had made no collective call yet; ", note), note
    states = {r["rank"]: r["exit_detail"] for r in report["ranks"]}
    assert states == {0: "was interrupted (SIGINT by the user)",
                      1: "was interrupted (SIGINT by the user)"}, states
    assert "nccl-doctor: INTERRUPTED" in err and "interrupted by you (SIGINT" in err
    replay = subprocess.run([*CLI, "replay", str(out), "--format", "json"], text=True,
                            capture_output=True, timeout=120)
    again = json.loads(replay.stdout)  # the same story offline
    assert again["findings"] == report["findings"] and again["notes"][0] == note


def _line(text: str) -> int:
    return 1 + next(i for i, ln in enumerate((JOBS / "train_loop.py").read_text().splitlines())
                    if text in ln)


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


def _ranks_by_hand(port: int, script: Path) -> list[str]:
    """Two ranks a shell starts (no torchrun: nothing ends a rank blocked in a collective on
    its SIGINT), as ``bash -c``."""
    start = " & ".join(f"RANK={r} {sys.executable} {script}" for r in (0, 1))
    return ["bash", "-c", f"export MASTER_ADDR=127.0.0.1 MASTER_PORT={port} WORLD_SIZE=2 "
            f"STEPS=100000 PAUSE=0.05 SLOW_RANK=1 SLOW_SECONDS=600; {start} & wait"]


def _ctrl_c(tmp_path: Path, presses: int, *options: str) -> tuple[subprocess.Popen, str, Path]:
    """``run --serve 0 OPTIONS`` of two ranks, rank 0 waiting in its all_reduce for rank 1; then
    ``presses`` SIGINTs to the doctor's process group, as a terminal sends them: (the run, its
    stderr, its --out)."""
    out = tmp_path / "cap"
    proc = subprocess.Popen([*CLI, "run", "--serve", "0", "--out", str(out), *options, "--",
                             *_ranks_by_hand(free_port(), JOBS / "train_loop.py")], text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            start_new_session=True)
    try:
        assert wait_for(lambda: len(rank_pids(out)) == 2, 60)
        time.sleep(2.0)
        for _ in range(presses):
            os.killpg(proc.pid, signal.SIGINT)
            time.sleep(0.1)
        _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()
    return proc, err, out


@pytest.mark.parametrize("presses", [1, 2])
def test_ctrl_c_is_the_users_it_ends_the_job_and_the_run_at_once(tmp_path, presses):
    """Ctrl-C to a run serving its report, rank 0 blocked in gloo's all_reduce (its
    KeyboardInterrupt never comes): what the SIGINT left is killed a moment later, no linger
    keeps the command, the report reads "interrupted by you"; a second Ctrl-C kills at once."""
    proc, err, out = _ctrl_c(tmp_path, presses, "--hang-after", "600", "--stuck-after", "600")
    assert proc.returncode == 130, err[-3000:]
    assert "serving the final report" not in err, err[-3000:]
    report = json.loads((out / "report.json").read_text())
    assert report["verdict"] == "interrupted", (report["findings"], err[-3000:])
    assert report["findings"] == [], report["findings"]
    assert report["notes"][0].startswith("interrupted by you (SIGINT"), report["notes"]
    assert "rank 0 had waited" in report["notes"][0], report["notes"][0]
    assert {r["state"] for r in report["ranks"]} == {"stopped"}, report["ranks"]
    assert not [p for p in rank_pids(out) if alive(p)]
    replay = subprocess.run([*CLI, "replay", str(out), "--format", "json"], text=True,
                            capture_output=True, timeout=120)
    again = json.loads(replay.stdout)  # the same offline
    assert (again["verdict"], again["notes"][0]) == ("interrupted", report["notes"][0])


def test_ctrl_c_after_a_hang_was_called_keeps_the_hang(tmp_path):
    """`--on-hang report` keeps the job running once the hang is called; the user's Ctrl-C
    then ends it: the hang stays the verdict and the root cause, and nothing lingers."""
    out = tmp_path / "cap"
    proc = subprocess.Popen([*CLI, "run", "--serve", "0", "--on-hang", "report", "--out",
                             str(out), "--", *torchrun(2, JOBS / "skip_broadcast.py")],
                            text=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            start_new_session=True)
    try:
        assert wait_for(lambda: (out / "report.json").is_file(), 120)  # the hang, reported
        os.killpg(proc.pid, signal.SIGINT)
        _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()
    assert "serving the final report" not in err, err[-3000:]
    report = json.loads((out / "report.json").read_text())
    assert report["verdict"] == "hang", (report["findings"], err[-3000:])
    root = next(f for f in report["findings"] if f["root_cause"])
    assert root["kind"] in ("missing_collective", "collective_mismatch"), root
    # (what the interrupt did to the stuck calls is not the backend's aftermath of the hang)
    assert "KeyboardInterrupt" not in json.dumps([report["findings"], report["notes"]])
    assert report["notes"][0].startswith("interrupted by you (SIGINT"), report["notes"]
    assert not [p for p in rank_pids(out) if alive(p)]
    replay = subprocess.run([*CLI, "replay", str(out), "--format", "json"], text=True,
                            capture_output=True, timeout=120)
    again = json.loads(replay.stdout)  # the same offline
    again_root = next(f for f in again["findings"] if f["root_cause"])
    assert (again["verdict"], again_root) == ("hang", root), again["findings"]
