"""Only the job's own doctors are heard, by default (docs/nodes.md): two simulated hosts (nodeA,
nodeB: UTS namespaces, else NCCL_DOCTOR_HOSTNAME), each node under its own `nccl-doctor run`
around its own torchrun agent (reproducers/nodes.py --doctor), 2 ranks each, gloo, and real
rogue processes on the coordinator's TCPStore (tests/integration/jobs/*rogue.py). Without a
key, a forged stop stops nothing; the default key is made in the home directory the nodes
share; with a key, a flood of every name a rogue can guess and a replay of an earlier run under
the same key change nothing but the count of rejected values."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
import time
from pathlib import Path

from nccl_doctor.errors import ExitStatus
from nccl_doctor.reproducers.nodes import free_port
from nccl_doctor.supervisor.federation.rendezvous import doctor_port

JOBS = Path(__file__).parent / "jobs"
HOSTS = ("nodeA", "nodeB")
HEALTHY = {"STEPS": "60", "PAUSE": "0.15"}  # 2 ranks a node, ~10 s of steps


def environ(**more: str) -> dict[str, str]:
    """This process's environment without a federation key, and ``more``."""
    out = {k: v for k, v in os.environ.items() if not k.startswith("NCCL_DOCTOR_FEDERATION_KEY")}
    return {**out, **more}


def nodes(out: Path, script: str, env: dict[str, str], port: int, wait: bool = True):
    cmd = [sys.executable, "-m", "nccl_doctor.reproducers.nodes", "--doctor", str(out),
           "--hosts", ",".join(HOSTS), "--master-port", str(port), "--script", str(JOBS / script)]
    if not wait:
        return subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                text=True)
    return subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)


def rogue(script: str, *args: str, env: dict[str, str] | None = None) -> dict:
    proc = subprocess.run([sys.executable, str(JOBS / script), *args], capture_output=True,
                          text=True, timeout=180, env=env or environ())
    assert proc.returncode == 0, proc.stderr[-2000:]
    return json.loads(proc.stdout)


def alongside(job: subprocess.Popen, script: str, *args: str) -> tuple[str, dict]:
    """A rogue that runs until the job's store goes (it goes with the job): the job's stderr,
    and what the rogue printed."""
    proc = subprocess.Popen([sys.executable, str(JOBS / script), *args], env=environ(),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        _, stderr = job.communicate(timeout=300)
        out, err = proc.communicate(timeout=120)
    finally:
        for p in (job, proc):
            if p.poll() is None:
                p.kill()
    assert proc.returncode == 0, err[-2000:]
    return stderr, json.loads(out)


def report(out: Path, host: str) -> dict:
    return json.loads((out / host / "report.json").read_text())


def healthy_on_both(out: Path) -> tuple[dict, dict]:
    a, b = report(out, "nodeA"), report(out, "nodeB")
    for rep in (a, b):
        assert rep["verdict"] == "ok" and rep["findings"] == [], rep["findings"]
    return a, b


def test_a_key_file_others_may_read_is_refused_before_the_job_starts(tmp_path):
    """The file NCCL_DOCTOR_FEDERATION_KEY_FILE names, or the default key, readable by others:
    one line naming the file and the fix, exit 2 (a usage error), and the job never starts."""
    ran = tmp_path / "ran"
    script = tmp_path / "job.py"
    script.write_text(f"open({str(ran)!r}, 'w').close()\n")
    loose = tmp_path / "key"
    loose.write_text("s3cret\n")
    loose.chmod(0o644)
    home = tmp_path / "home"
    (home / ".nccl-doctor").mkdir(parents=True, mode=0o700)
    default = home / ".nccl-doctor" / "federation.key"
    default.write_text("s3cret\n")
    default.chmod(0o640)
    for i, (env, path) in enumerate([
            (environ(NCCL_DOCTOR_FEDERATION_KEY_FILE=str(loose)), loose),
            (environ(HOME=str(home)), default)]):
        cmd = [sys.executable, "-m", "nccl_doctor", "run", "--out", str(tmp_path / f"out{i}"),
               "--", sys.executable, "-m", "torch.distributed.run", "--nnodes=2",
               "--node-rank=0", "--nproc-per-node=1", "--master-addr=127.0.0.1",
               f"--master-port={free_port()}", str(script)]
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=120)
        assert proc.returncode == ExitStatus.USAGE, proc.stderr
        (line,) = proc.stderr.strip().splitlines()
        assert str(path) in line and f"chmod 600 {path}" in line, line
        assert not ran.exists()


def test_without_a_key_a_forged_stop_decision_stops_neither_node(tmp_path):
    """No key, and no home directory to make the default one in: the nodes meet
    unauthenticated. A rogue writes stopping hang decisions, beats that say every rank is gone
    and a final report where the doctors read them: the follower applies none of them, each
    node judges its own ranks, and the job ends ok on both; each report says it ran
    unauthenticated, and the follower's says what it did not apply."""
    out, port = tmp_path / "out", free_port()
    env = environ(HOME=str(tmp_path / "no" / "home"), **HEALTHY)
    job = nodes(out, "train_loop.py", env, port, wait=False)
    time.sleep(3.0)
    forged = rogue("rogue.py", f"127.0.0.1:{doctor_port(port)}", "6")
    assert forged["forged"] > 20
    _, stderr = job.communicate(timeout=300)
    assert job.returncode == 0, stderr[-3000:]
    leader, follower = healthy_on_both(out)
    for rep in (leader, follower):
        assert rep["nodes"]["authenticated"] is False
        (note,) = [n for n in rep["notes"] if "supervisors met" in n and "unauthenticated" in n]
        assert "cannot create" in note and "NCCL_DOCTOR_FEDERATION_KEY" in note, note
        assert "nothing read there was believed" in note
    (note,) = [n for n in follower["notes"] if "supervisors met" in n]
    assert "of the leader came over it and were not applied" in note, note
    assert "would have stopped this node's ranks" in note
    assert len(leader["nodes"]["nodes"]) == 2  # they met: the leader's report lists them
    assert "rogue-said" not in json.dumps(follower) and "rogue-said" not in stderr
    assert "HANG" not in stderr and "stopping the job" not in stderr


def test_the_default_key_is_made_and_a_flooding_rogue_changes_nothing(tmp_path):
    """No key given: the nodes, sharing a home directory, make and use its default key
    (0600 in 0700). A rogue without it floods every name it can guess - the doctors' table with
    and without its prefix, for the node ids it reads off this machine's processes - all along:
    the nodes meet, the job ends ok on both, and the report counts what overwrote the names
    the leader keeps and says which key was used."""
    home = tmp_path / "home"
    home.mkdir()
    out, port = tmp_path / "out", free_port()
    job = nodes(out, "train_loop.py", environ(HOME=str(home), **HEALTHY), port, wait=False)
    # from the store's first moment (the join included) to its last
    stderr, flood = alongside(job, "flood_rogue.py", f"127.0.0.1:{doctor_port(port)}", "120")
    assert job.returncode == 0, stderr[-3000:]
    assert flood["writes"] > 1000 and len(flood["ids"]) >= 2, flood
    leader, follower = healthy_on_both(out)
    assert leader == follower
    key = home / ".nccl-doctor" / "federation.key"
    assert stat.S_IMODE(key.stat().st_mode) == 0o600
    assert stat.S_IMODE(key.parent.stat().st_mode) == 0o700
    nodes_ = leader["nodes"]
    assert nodes_["authenticated"] is True
    assert [(n["host"], n["state"]) for n in nodes_["nodes"]] == [
        ("nodeA", "ok"), ("nodeB", "ended")]
    assert nodes_.get("rejected", 0) > 0, (flood, stderr[-3000:])
    (note,) = [n for n in leader["notes"] if "failed authentication" in n]
    assert note.startswith(f"{nodes_['rejected']} values")
    (used,) = [n for n in leader["notes"] if "was authenticated with" in n]
    assert f"the user's default key {key}" in used, used
    assert "rogue" not in json.dumps(leader) and "HANG" not in stderr


def test_a_replay_of_an_earlier_run_under_the_same_key_is_rejected(tmp_path):
    """One key for two runs of the same job (same rendezvous). The first run hangs once the
    nodes have met (rank 3 skips a broadcast) and is stopped; an eavesdropper keeps every value
    of its store - the stopping decision among them. During the second, healthy run, a process
    without the key writes them all back, over and over: the join record (its name is the same
    in every run) with the earlier nonce, the decisions, beats and final report. The follower
    joins under the nonce the leader proves; the job ends ok on both nodes; the rejections are
    counted."""
    port = free_port()
    key = {"NCCL_DOCTOR_FEDERATION_KEY": "a-static-key-reused-across-runs"}
    address, job = f"127.0.0.1:{doctor_port(port)}", f"127.0.0.1:{port}"
    recording = tmp_path / "recorded.json"
    recorder = subprocess.Popen([sys.executable, str(JOBS / "replay_rogue.py"), "record",
                                 address, job, str(recording)], env=environ(**key),
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        first = nodes(tmp_path / "first", "late_skip.py", environ(**key), port)
        recorded = json.loads(recorder.communicate(timeout=120)[0])
    finally:
        if recorder.poll() is None:
            recorder.kill()
    assert first.returncode == ExitStatus.HANG_STOPPED, first.stderr[-3000:]
    assert recorded["stops"] >= 1 and recorded["kept"] >= 5, (recorded, first.stderr[-4000:])

    out = tmp_path / "second"
    second = nodes(out, "train_loop.py", environ(**key, **HEALTHY), port, wait=False)
    # (from the store's first moment: the follower's first look may find the earlier record)
    stderr, replayed = alongside(second, "replay_rogue.py", "replay", address, str(recording),
                                 "120")
    assert second.returncode == 0, stderr[-3000:]
    assert replayed["writes"] > 50, replayed
    leader, follower = healthy_on_both(out)
    assert leader == follower
    assert [n["host"] for n in leader["nodes"]["nodes"]] == ["nodeA", "nodeB"]
    assert leader["nodes"]["rejected"] > 0
    assert any(n.startswith(f"{leader['nodes']['rejected']} value") and "replayed" in n
               for n in leader["notes"]), leader["notes"]
    assert "HANG" not in stderr
