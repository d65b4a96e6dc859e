"""What happens to a run when its supervisor is killed, when it is replayed while it still runs,
when its command cannot start, and when its output paths cannot be written."""

from __future__ import annotations

import json
import signal
import subprocess
import time

import pytest

from nccl_doctor.errors import ExitStatus

from .conftest import CLI, JOBS, alive, doctor, os, rank_pids, spawn, torchrun, wait_for

pytestmark = pytest.mark.integration


def start(out, env: dict[str, str], *options: str) -> subprocess.Popen:
    """``nccl-doctor run`` around 2 ranks of train_loop.py; returns once both ranks are up."""
    proc = subprocess.Popen([*CLI, "run", "--quiet", "--out", str(out), *options, "--",
                             *torchrun(2, JOBS / "train_loop.py")],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, **env})
    ready = 0
    while ready < 2:
        line = proc.stdout.readline()
        assert line, f"the job ended before its ranks were up: {proc.stderr.read()[-2000:]}"
        ready += line.count("ready")  # two ranks' lines can interleave into one
    assert wait_for(lambda: len(rank_pids(out)) == 2, 30)
    time.sleep(2.0)  # the supervisor's registry finds the ranks (it looks every 0.2 s)
    return proc


def finish(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
    proc.communicate(timeout=60)


def test_a_sigkilled_supervisor_takes_its_job_with_it_and_replay_says_so(tmp_path):
    out = tmp_path / "cap"
    proc = start(out, {"STEPS": "100000", "PAUSE": "0.05"})
    ranks = rank_pids(out)
    launcher = [p for p in ranks if alive(p)]
    assert len(launcher) == 2
    proc.kill()  # SIGKILL: no handler, no cleanup of its own
    proc.wait()
    try:
        # the reaper's grace is 10 s after SIGTERM; torchrun stops its workers well before
        assert wait_for(lambda: not any(alive(p) for p in ranks), 30), \
            [p for p in ranks if alive(p)]
    finally:
        for p in ranks:
            if alive(p):
                os.kill(p, signal.SIGKILL)
        finish(proc)
    assert wait_for(lambda: (out / "watchdog.json").exists(), 30)  # once the job is gone
    watch = json.loads((out / "watchdog.json").read_text())
    (lost,) = [e for e in watch["events"] if e["event"] == "supervisor_lost"]
    assert lost["signals"][0] == "SIGTERM"
    assert json.loads((out / "manifest.json").read_text())["ended_at"] is None
    for attempt in (1, 2):  # the first replay finishes the manifest; the second reads it
        replay = doctor("replay", str(out), "--format", "json")
        assert replay.returncode == 0, replay.stderr
        report = json.loads(replay.stdout)
        assert report["verdict"] == "unfinished", report
        assert any("was lost at" in n and "its reaper stopped the job (SIGTERM" in n
                   for n in report["notes"]), report["notes"]
        assert not [f for f in report["findings"] if f["kind"] == "missing_collective"]
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["ended_at"] == manifest["extra"]["supervisor_lost_at"] == lost["at"]


def test_replay_of_a_running_job_does_not_call_a_hang(tmp_path):
    out = tmp_path / "cap"
    # rank 0 waits in all_reduce #1 while rank 1 loads a batch for a minute: healthy, so far
    proc = start(out, {"STEPS": "2", "SLOW_RANK": "1", "SLOW_SECONDS": "60"}, "--no-watch")
    try:
        replay = doctor("replay", str(out), "--format", "json")
    finally:
        finish(proc)
    assert replay.returncode == 0, replay.stderr
    report = json.loads(replay.stdout)
    assert report["verdict"] == "unfinished", report["verdict"]
    assert report["findings"] == [] or all(f["kind"] != "missing_collective"
                                           for f in report["findings"])
    notes = report["notes"]
    assert any(n.startswith(f"the job is still running (nccl-doctor run, pid {proc.pid})")
               for n in notes), notes
    assert any(n.startswith("not a hang until the job is seen to stop: ") and "all_reduce" in n
               for n in notes), notes
    console = doctor("replay", str(out))  # the job has ended since, its supervisor with it
    assert "UNFINISHED" not in console.stdout or "still running" not in console.stdout


def test_a_command_that_cannot_start_leaves_nothing_behind(tmp_path):
    out = tmp_path / "new" / "cap"
    failed = doctor("run", "--out", str(out), "--", "/no/such/command")
    assert failed.returncode == ExitStatus.LAUNCH_FAILED
    assert "cannot run '/no/such/command'" in failed.stderr
    assert not (tmp_path / "new").exists()  # what it created is gone, to the top
    mine = tmp_path / "mine"
    mine.mkdir()
    assert doctor("run", "--out", str(mine), "--", "/no/such/command").returncode == 8
    assert mine.is_dir() and not any(mine.iterdir())  # the user's directory stays, empty
    again = doctor("run", "--quiet", "--out", str(mine), "--", "true")  # not "not empty"
    assert again.returncode == 0, again.stderr


@pytest.mark.parametrize("args, flag", [
    (["run", "--out", "/proc/nccl-doctor-test", "--", "true"], "--out"),
    (["run", "--out", "{file}/sub", "--", "true"], "--out"),
    (["replay", "{capture}", "-o", "/proc/nccl-doctor-test.json"], "-o"),
], ids=["run-out-proc", "run-out-under-a-file", "replay-o-proc"])
def test_unwritable_paths_are_one_line_naming_the_flag(tmp_path, args, flag):
    afile = tmp_path / "afile"
    afile.write_text("x")
    capture = tmp_path / "cap"
    if "{capture}" in args:
        made = doctor("run", "--quiet", "--out", str(capture), "--", *spawn(2, JOBS / "clean.py"))
        assert made.returncode == 0, made.stderr
    proc = doctor(*[a.format(file=afile, capture=capture) for a in args])
    assert proc.returncode == ExitStatus.UNWRITABLE, proc.stderr
    (line,) = proc.stderr.strip().splitlines()
    assert line.startswith(f"nccl-doctor: error: {flag} ") and f"choose a writable {flag}" in line
    assert "internal error" not in line and "Traceback" not in proc.stderr


def test_one_rank_file_is_replayed_as_one_rank(tmp_path):
    out = tmp_path / "cap"
    made = doctor("run", "--quiet", "--out", str(out), "--", *spawn(2, JOBS / "clean.py"))
    assert made.returncode == 0, made.stderr
    for one in sorted(out.glob("rank*.ndcap")):
        replay = doctor("replay", str(one), "--format", "json")
        assert replay.returncode == 0, replay.stderr
        report = json.loads(replay.stdout)
        assert report["verdict"] == "ok" and report["findings"] == [], report
        assert any("holds one rank's capture" in n for n in report["notes"]), report["notes"]
        assert {r["exit_detail"] for r in report["ranks"] if r["state"] == "no_capture"} == {
            "not in this replay"}


def test_a_job_launched_the_instant_before_its_supervisor_died_is_stopped(tmp_path):
    """The reaper starts before the job: a supervisor killed between launching the job and
    telling the reaper its process group (here: never told) still takes the job with it - the
    reaper finds it by the run's id in its environment (launch.py, reaper.py)."""
    import sys

    from nccl_doctor.supervisor.reaper import Reaper
    from nccl_doctor.watch_log import SupervisorLost
    from nccl_doctor.capture.watch_record import read_watch_log

    reaper = Reaper(tmp_path, "run-untold-1")
    job = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"],
                           env={**os.environ, "NCCL_DOCTOR_RUN_ID": "run-untold-1"},
                           start_new_session=True)
    other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"],
                             env={**os.environ, "NCCL_DOCTOR_RUN_ID": "run-untold-2"},
                             start_new_session=True)
    try:
        time.sleep(0.5)  # (the job's environment is in /proc once it runs)
        reaper._pipe.close()  # the supervisor gone: end of file, no "done", no "job PGID"
        assert job.wait(timeout=30) == -signal.SIGTERM
        assert other.poll() is None  # another run's process is left alone
        assert reaper.proc.wait(timeout=30) == 0  # (it writes its record, then exits)
        log = read_watch_log(tmp_path)
        assert log is not None and isinstance(log.lost, SupervisorLost)
        assert log.lost.signals == ("SIGTERM",)
    finally:
        for p in (job, other):
            if p.poll() is None:
                p.kill()
                p.wait()
