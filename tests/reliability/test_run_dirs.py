"""Runs never share a capture directory: the default --out is new for every run (time, host,
pid), even for runs started in the same second on one host or on hosts sharing a filesystem;
an --out another live run holds is refused, even with --force; a killed run's leftovers block
nothing. Real `nccl-doctor run` processes (the jobs are small Python commands)."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from pathlib import Path

from nccl_doctor.errors import ExitStatus

from .conftest import CLI, doctor, os, wait_for

JOB = [sys.executable, "-c", "import time; time.sleep(1.0); print('job done')"]


def start(cwd: Path, *args: str, host: str | None = None) -> subprocess.Popen:
    env = dict(os.environ)
    if host is not None:
        env["NCCL_DOCTOR_HOSTNAME"] = host  # the host name a node's doctor reports
    return subprocess.Popen([*CLI, "run", *args, "--", *JOB], cwd=cwd, env=env, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)


def finished(procs: list[subprocess.Popen]) -> list[tuple[int, str, str]]:
    said = [p.communicate(timeout=120) for p in procs]
    return [(p.returncode, out, err) for p, (out, err) in zip(procs, said)]


def complete(run: Path) -> dict:
    """The run's manifest, checked whole: ended, with the job's exit status, beside its report."""
    manifest = json.loads((run / "manifest.json").read_text())
    assert manifest["ended_at"] is not None and manifest["exit_status"] == 0, manifest
    assert json.loads((run / "report.json").read_text())["verdict"] == "not_recorded"
    assert not (run / ".nccl-doctor.lock").exists()  # the claim ends with the run
    return manifest


def test_runs_started_together_keep_a_directory_each(tmp_path):
    procs = [start(tmp_path), start(tmp_path), start(tmp_path)]
    results = finished(procs)
    assert [r[0] for r in results] == [0, 0, 0], results
    runs = sorted((tmp_path / "nccl-doctor-out").iterdir())
    assert len(runs) == 3
    said = sorted(line.split()[1] for _, _, err in results for line in err.splitlines()
                  if line.startswith("Wrote "))
    assert len(set(said)) == 3  # each run names its own report
    pids = {str(p.pid) for p in procs}
    for run in runs:
        assert run.name.startswith("run-") and run.name.rsplit("-", 1)[1] in pids
        complete(run)


def test_hosts_sharing_a_filesystem_keep_a_directory_each(tmp_path):
    # two nodes of one job array writing the default --out into one shared working directory
    results = finished([start(tmp_path, host="nodeA"), start(tmp_path, host="nodeB")])
    assert [r[0] for r in results] == [0, 0], results
    runs = sorted((tmp_path / "nccl-doctor-out").iterdir())
    # (sorted by host: under load the two may start in different seconds)
    assert sorted(r.name.split("-")[3] for r in runs) == ["nodeA", "nodeB"]
    for run in runs:
        complete(run)


def sleeping_run(out: Path) -> subprocess.Popen:
    """A run of a job that sleeps a minute, holding ``out``."""
    return subprocess.Popen([*CLI, "run", "--quiet", "--out", str(out), "--", sys.executable,
                             "-c", "import time; time.sleep(60)"], text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)


def test_a_live_runs_directory_is_refused_even_with_force(tmp_path):
    out = tmp_path / "shared"
    first = sleeping_run(out)
    try:
        assert wait_for(lambda: (out / "manifest.json").is_file(), 60)
        before = (out / "manifest.json").read_text()
        second = doctor("run", "--force", "--out", str(out), "--", *JOB)
        assert second.returncode == ExitStatus.IN_USE, second.stderr
        (line,) = second.stderr.splitlines()
        assert line.startswith(f"nccl-doctor: error: --out {out} is in use by a live "
                               f"nccl-doctor run (pid {first.pid} on host ")
        assert "--force never takes a running job's directory" in line
        assert (out / "manifest.json").read_text() == before  # nothing of the first touched
    finally:
        first.send_signal(signal.SIGINT)
        first.communicate(timeout=60)
    again = doctor("run", "--force", "--out", str(out), "--", *JOB)  # its run is over: free
    assert again.returncode == 0, again.stderr
    complete(out)


def test_a_killed_runs_leftovers_claim_nothing(tmp_path):
    out = tmp_path / "killed"
    first = sleeping_run(out)
    assert wait_for(lambda: (out / ".nccl-doctor.lock").is_file(), 60)
    first.kill()  # SIGKILL: no chance to release its claim (the kernel drops the lock)
    first.communicate(timeout=60)
    assert (out / ".nccl-doctor.lock").is_file()
    plain = doctor("run", "--out", str(out), "--", *JOB)
    assert plain.returncode == ExitStatus.OUTPUT_EXISTS, plain.stderr  # an earlier run's files
    forced = doctor("run", "--force", "--out", str(out), "--", *JOB)
    assert forced.returncode == 0, forced.stderr
    complete(out)
