"""The fork server (nccl_doctor/testing/zygote.py): a rank it forks behaves under the doctor as a
fresh process does - the same diagnosis, its own capture with its own pid, argv, sys.path, cwd and
stdout - and nothing of a job outlives it: not when its launcher is killed, not when the server
or the test process dies."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from nccl_doctor.capture.names import capture_files
from nccl_doctor.capture.reader import read_counters
from nccl_doctor.supervisor.supervisor import Supervisor
from nccl_doctor.testing import spawn, zygote

JOB = Path(__file__).parent / "jobs" / "ends.py"
pytestmark = pytest.mark.skipif(zygote.supported() is not None, reason="fork server: Linux only")


def supervised(tmp_path: Path, end: str, fork: bool):
    seen = tmp_path / f"{end}-{fork}"
    seen.mkdir()
    command = spawn.command(2, [str(JOB)], fork=fork)
    assert ("--zygote" in command) is fork, zygote.why_not()
    env = dict(os.environ, END=end, SEEN=str(seen))
    result = Supervisor(command, seen / "out", environ=env).run()
    ranks = {r: json.loads((seen / f"rank{r}.json").read_text()) for r in range(2)}
    return result, ranks, seen / "out"


def essentials(result) -> tuple:
    """What the diagnosis says of the job and of its culprit, rank 1 (how fast rank 0 learns
    of rank 1's end - a gloo error, or the launcher's SIGTERM first - is a race either way)."""
    d = result.diagnosis
    root = d.root_cause
    return (result.exit_status, result.stopped_for_hang, d.verdict,
            root and (root.kind, root.ranks, root.title, root.seq),
            sorted((f.kind.value, f.ranks) for f in d.findings if 1 in f.ranks))


@pytest.mark.parametrize("end", ["clean", "raise", "kill", "hang"])
def test_a_forked_rank_is_diagnosed_as_a_fresh_one(tmp_path, end):
    fresh, fresh_ranks, _ = supervised(tmp_path, end, fork=False)
    forked, ranks, out = supervised(tmp_path, end, fork=True)
    assert essentials(forked) == essentials(fresh)
    if end == "clean":
        assert forked.diagnosis.verdict.value == "ok" and forked.exit_status == 0
    elif end == "hang":
        assert forked.stopped_for_hang and forked.diagnosis.root_cause.ranks == (1,)
    else:
        assert forked.diagnosis.root_cause.ranks == (1,)
    # each rank is itself: its own pid in its own capture (what the watchdog and py-spy use),
    # none the server's, and the target's argv, sys.path[0] and cwd as a fresh rank's
    server = zygote._server.proc.pid
    headers = {}
    for path in capture_files(out):
        meta = read_counters(path)[0]
        headers[meta["rank"]] = meta["pid"]
    assert headers == {r: ranks[r]["pid"] for r in range(2)}
    assert server not in headers.values() and len(set(headers.values())) == 2
    for r in range(2):
        # the environment others see (/proc/PID/environ: the GPU sampler's) is the rank's own
        shown, environ = ranks[r].pop("proc_environ"), ranks[r].pop("environ")
        assert shown == environ and shown["RANK"] == str(r)
        assert shown["NCCL_DOCTOR_DIR"] == str(out.absolute())
        fresh_shown, fresh_environ = (fresh_ranks[r].pop(k) for k in ("proc_environ", "environ"))
        assert set(shown) == set(fresh_shown) and set(environ) == set(fresh_environ)
        same = {k: v for k, v in ranks[r].items() if k != "pid"}
        assert same == {k: v for k, v in fresh_ranks[r].items() if k != "pid"}
        assert ranks[r]["argv"] == [str(JOB)] and ranks[r]["path0"] == str(JOB.parent)
        assert not psutil.pid_exists(ranks[r]["pid"])  # nothing left running


def test_a_forked_rank_writes_to_its_launchers_stdout(tmp_path):
    done = subprocess.run(spawn.command(2, [str(JOB)]), env=dict(os.environ, SEEN=str(tmp_path)),
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert sorted(done.stdout.splitlines()) == ["rank 0 says hello", "rank 1 says hello"]


def test_a_raising_ranks_traceback_starts_at_its_script(tmp_path):
    done = subprocess.run(spawn.command(2, [str(JOB)]),
                          env=dict(os.environ, SEEN=str(tmp_path), END="raise"),
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 1  # as torchrun, for a failed worker
    tb = done.stderr[done.stderr.index("Traceback"):]
    assert f'File "{JOB}"' in tb.splitlines()[1] and "ValueError: rank 1 gives up" in tb
    assert "zygote.py" not in tb and "runpy" not in tb


def wait_for(paths: list[Path], proc: subprocess.Popen) -> None:
    deadline = time.monotonic() + 60
    while not all(p.exists() for p in paths):
        assert time.monotonic() < deadline and proc.poll() is None
        time.sleep(0.05)


def test_a_killed_launchers_ranks_are_killed(tmp_path):
    """SIGKILL to the launched command (the supervisor's last word to a job that will not
    stop): the server sees its connection close and kills that client's ranks."""
    proc = subprocess.Popen(spawn.command(2, [str(JOB)]),
                            env=dict(os.environ, SEEN=str(tmp_path), END="hang"),
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    wait_for([tmp_path / f"rank{r}.json" for r in range(2)], proc)
    pids = [json.loads((tmp_path / f"rank{r}.json").read_text())["pid"] for r in range(2)]
    assert all(psutil.Process(p).ppid() == zygote._server.proc.pid for p in pids)
    proc.kill()
    proc.wait()
    assert psutil.wait_procs([psutil.Process(p) for p in pids if psutil.pid_exists(p)],
                             timeout=10)[1] == []


def test_sigterm_to_the_launcher_reaches_forked_ranks(tmp_path):
    proc = subprocess.Popen(spawn.command(2, [str(JOB)]),
                            env=dict(os.environ, SEEN=str(tmp_path), END="hang"),
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    wait_for([tmp_path / f"rank{r}.json" for r in range(2)], proc)
    time.sleep(0.5)  # rank 0 waits in its third all_reduce, rank 1 in its fourth
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=60) == 1  # the ranks died of it: a failed rank, as spawn says


def test_the_server_dies_with_the_test_process(tmp_path):
    """A test process killed outright leaves no server (nor its ranks) behind."""
    script = ("import time; from nccl_doctor.testing import zygote\n"
              "assert zygote.address()\n"
              "print(zygote._server.proc.pid, zygote._server.dir, flush=True)\n"
              "time.sleep(600)\n")
    proc = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    pid, directory = proc.stdout.readline().split()
    server = int(pid)
    assert psutil.pid_exists(server) and Path(directory).is_dir()
    proc.kill()
    proc.wait()
    gone, alive = psutil.wait_procs([psutil.Process(server)], timeout=10)
    assert not alive and not Path(directory).exists()  # its socket's directory went with it


def test_opting_out_starts_ranks_fresh(monkeypatch):
    monkeypatch.setenv(zygote.OPT_OUT, "0")
    assert zygote.address() is None and "NCCL_DOCTOR_FORK_SERVER=0" in zygote.why_not()
    assert "--zygote" not in spawn.command(2, ["job.py"])


def test_a_killed_servers_ranks_are_killed(tmp_path):
    """The server SIGKILLed mid-job (its own one here: the session's goes on serving): its
    ranks die with it (their parent's death signal), and the launcher says they failed."""
    server = zygote.Server()
    try:
        assert server.ready()
        command = [sys.executable, "-m", "nccl_doctor.testing.spawn", "--zygote", server.address,
                   "--nproc", "2", str(JOB)]
        proc = subprocess.Popen(command, env=dict(os.environ, SEEN=str(tmp_path), END="hang"),
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        wait_for([tmp_path / f"rank{r}.json" for r in range(2)], proc)
        pids = [json.loads((tmp_path / f"rank{r}.json").read_text())["pid"] for r in range(2)]
        server.proc.kill()
        assert proc.wait(timeout=30) == 1
        assert psutil.wait_procs([psutil.Process(p) for p in pids if psutil.pid_exists(p)],
                                 timeout=10)[1] == []
    finally:
        server.close()
