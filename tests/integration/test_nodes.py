"""Several hosts, one diagnosis: two simulated hosts on this machine, each node's `nccl-doctor
run` in its own UTS namespace (hostnames nodeA and nodeB) around its own torchrun agent
(``--nnodes 2`` on 127.0.0.1), launched by reproducers/nodes.py --doctor.

Where UTS namespaces are refused, nodes.py says so and names the hosts through
NCCL_DOCTOR_HOSTNAME instead; these tests then print that they ran on the fallback.
"""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from conftest import own_home  # (this directory: on sys.path)
from nccl_doctor.analysis.calls.loaded import load
from nccl_doctor.analysis import analyze
from nccl_doctor.diagnosis import FindingKind, Verdict
from nccl_doctor.errors import ExitStatus
from nccl_doctor.reproducers.nodes import free_port, namespaces_work, node_command
from nccl_doctor.supervisor.federation.rendezvous import doctor_port

JOBS = Path(__file__).parent / "jobs"
HOSTS = ("nodeA", "nodeB")


def nodes(out: Path, target: list[str], env: dict[str, str], *more: str,
          wait: bool = True, timeout: float = 240):
    """Two nodes, each under its own nccl-doctor run --out OUT/HOST, at home in the test's own
    directory (``own_home``) unless ``env`` gives HOME."""
    cmd = [sys.executable, "-m", "nccl_doctor.reproducers.nodes", "--doctor", str(out),
           "--hosts", ",".join(HOSTS), *more, *target]
    environ = {**os.environ, "HOME": own_home(out), **env}
    if not wait:
        return subprocess.Popen(cmd, env=environ, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True)
    proc = subprocess.run(cmd, env=environ, capture_output=True, text=True, timeout=timeout)
    _say_fallback(proc.stderr)
    return proc


def _say_fallback(stderr: str) -> None:
    if "UTS namespaces refused" in stderr:
        print("UTS namespaces refused here: the hosts were simulated with NCCL_DOCTOR_HOSTNAME")


def report(out: Path, host: str) -> dict:
    return json.loads((out / host / "report.json").read_text())


def root(rep: dict) -> dict:
    return next(f for f in rep["findings"] if f["root_cause"])


def test_the_host_fallback_is_said_or_namespaces_work():
    """Each simulated node's command names its host the way the node's doctor reads it
    (``env.host_name``): in a UTS namespace of its own where this machine allows one, else
    through NCCL_DOCTOR_HOSTNAME; a refusal says why."""
    ok, why = namespaces_work()
    print("UTS namespaces:", "available" if ok else f"refused ({why}): NCCL_DOCTOR_HOSTNAME")
    assert ok or why, "namespaces refused without a reason"
    cmd, extra = node_command(1, 2, 1, 29500, ["train.py"], "/tmp/out", "nodeB", [], ok)
    assert cmd[cmd.index("--out") + 1] == os.path.join("/tmp/out", "nodeB")
    wrapper = cmd[:cmd.index(sys.executable)]  # what puts the node on its host
    probe = [sys.executable, "-c", "from nccl_doctor.env import host_name; print(host_name())"]
    env = {k: v for k, v in os.environ.items() if k != "NCCL_DOCTOR_HOSTNAME"}
    named = subprocess.run(wrapper + probe, env=dict(env, **extra), capture_output=True,
                           text=True, timeout=60)
    assert named.returncode == 0, named.stderr
    assert named.stdout.strip() == "nodeB" != socket.gethostname()
    if os.geteuid() == 0 and not ok:
        pytest.fail(f"running as root but unshare -u is refused ({why}): the multi-node tests "
                    "run on the NCCL_DOCTOR_HOSTNAME fallback")


@pytest.fixture(scope="module")
def skipped(tmp_path_factory):
    """Global rank 3 (on nodeB) skips a broadcast."""
    out = tmp_path_factory.mktemp("skip") / "nodes"
    proc = nodes(out, ["--script", str(JOBS / "skip_broadcast.py")], {"SKIPPER": "3"})
    return out, proc


def test_a_rank_on_another_host_skipping_a_broadcast_is_one_diagnosis(skipped):
    out, proc = skipped
    assert proc.returncode == ExitStatus.HANG_STOPPED, proc.stderr[-3000:]
    a, b = report(out, "nodeA"), report(out, "nodeB")
    assert (out / "nodeA" / "report.json").read_bytes() == (out / "nodeB" / "report.json").read_bytes()
    cause = root(a)
    assert cause["kind"] in ("collective_mismatch", "missing_collective")
    assert cause["ranks"] == [3], cause
    assert cause["evidence"]["hosts"] == {"3": "nodeB"}
    assert "rank 3 on nodeB" in cause["title"]
    assert cause["callsite"].endswith("skip_broadcast.py:15")  # the culprit's call
    assert "broadcast" in cause["detail"] and "skip_broadcast.py:19" in cause["detail"]  # theirs
    assert a["verdict"] == "hang" and a["watchdog"]["how"] == "deadlock"
    hosts = {r["rank"]: r["host"] for r in a["ranks"]}
    assert hosts == {0: "nodeA", 1: "nodeA", 2: "nodeB", 3: "nodeB"}
    assert a["nodes"]["diagnosed_by"]["host"] == "nodeA"
    assert [(n["host"], n["ranks"]) for n in a["nodes"]["nodes"]] == [
        ("nodeA", [0, 1]), ("nodeB", [2, 3])]
    # each node's supervisor stopped its own ranks for the hang
    assert {r["state"] for r in b["ranks"]} == {"stopped"}, [r["exit_detail"] for r in b["ranks"]]
    print("cross-host deadlock called", a["watchdog"]["waited_s"], "s after the last progress")


def test_replay_of_the_nodes_directories_is_the_live_diagnosis(skipped):
    out, _ = skipped
    live = root(report(out, "nodeA"))
    for paths in ([out / "nodeB", out / "nodeA"], [out]):
        d = analyze(load(*paths))
        r = d.root_cause
        assert d.verdict is Verdict.HANG
        assert (r.kind.value, r.ranks, r.group, r.seq, r.callsite) == (
            live["kind"], tuple(live["ranks"]), live["group"], live["seq"], live["callsite"])
        assert {s.rank: s.state for s in d.ranks} == {0: "stopped", 1: "stopped",
                                                       2: "stopped", 3: "stopped"}
    # through the command, as a user replays the nodes' directories after an rsync
    proc = subprocess.run([sys.executable, "-m", "nccl_doctor", "replay", str(out / "nodeA"),
                           str(out / "nodeB"), "--format", "json"], capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    replayed = root(json.loads(proc.stdout))
    assert {k: replayed[k] for k in ("kind", "ranks", "group", "seq", "callsite")} == {
        k: live[k] for k in ("kind", "ranks", "group", "seq", "callsite")}
    # one node's directory alone is a part of the job: it blames no unseen rank
    alone = analyze(load(out / "nodeA"))
    assert any("replay every node's directory together" in n for n in alone.notes)
    assert all(3 not in f.ranks for f in alone.findings if f.kind is FindingKind.MISSING_COLLECTIVE)


def test_a_shape_mismatch_across_hosts_is_named_on_both(tmp_path):
    out = tmp_path / "nodes"
    proc = nodes(out, ["--script", str(JOBS / "shape_mismatch.py")], {"CULPRIT": "2"})
    assert proc.returncode != 0
    a, b = report(out, "nodeA"), report(out, "nodeB")
    assert a == b
    cause = root(a)
    assert cause["kind"] == "collective_mismatch" and cause["ranks"] == [2]
    assert cause["evidence"]["hosts"] == {"2": "nodeB"} and "float32[12]" in cause["title"]
    assert cause["callsite"].endswith("shape_mismatch.py:14")


def test_a_rank_on_a_follower_that_cannot_make_its_capture_is_unrecorded_not_unseen(tmp_path):
    """Global rank 3 (on nodeB, the follower) cannot create its capture file (RLIMIT_FSIZE): its
    node's summary says so, and the leader's report is OK with the reason - not "the ranks of
    nodes that never joined the coordinator are unseen" with rank 3 on another host."""
    out = tmp_path / "nodes"
    proc = nodes(out, ["--script", str(JOBS / "unrecorded.py")], {"UNRECORDED": "3"})
    assert proc.returncode == 0, proc.stderr[-3000:]
    a = report(out, "nodeA")
    assert a == report(out, "nodeB")
    assert a["verdict"] == "ok" and a["findings"] == [], a["findings"]
    states = {r["rank"]: (r["state"], r["exit_detail"], r["host"]) for r in a["ranks"]}
    assert states[3] == ("no_capture", "not recorded (see the note)", "nodeB"), states
    assert {states[r][0] for r in (0, 1, 2)} == {"exited"}
    note = next(n for n in a["notes"] if n.startswith("rank 3 on nodeB was not recorded: "))
    assert "it cannot create its capture in" in note and "nodeB" in note, note
    assert not any("unseen" in n and "never joined" in n for n in a["notes"]), a["notes"]
    assert [(n["host"], n["ranks"]) for n in a["nodes"]["nodes"]] == [
        ("nodeA", [0, 1]), ("nodeB", [2, 3])]
    again = analyze(load(out / "nodeA", out / "nodeB"))  # replay agrees
    assert again.verdict is Verdict.OK and again.findings == ()
    assert [(s.rank, s.exit_detail) for s in again.ranks if s.state == "no_capture"] == [
        (3, "not recorded (see the note)")]


def _wait_for(predicate, timeout: float, what: str) -> None:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if predicate():
            return
        time.sleep(0.2)
    raise AssertionError(f"timed out waiting for {what}")


def _doctor_of(pid: int) -> int:
    """The node's `nccl-doctor run` process: ``pid`` or the first of its descendants running
    nccl_doctor's CLI (a namespace wrapper may stand in front of it)."""
    for p in [psutil.Process(pid), *psutil.Process(pid).children(recursive=True)]:
        try:
            cmd = " ".join(p.cmdline())
        except psutil.Error:
            continue
        if "nccl_doctor" in cmd and " run " in f" {cmd} " and "reaper" not in cmd:
            return p.pid
    raise AssertionError(f"no nccl-doctor run under pid {pid}")


def _kill_tree(pid: int) -> None:
    procs = [psutil.Process(pid)]
    procs += procs[0].children(recursive=True)
    for p in procs:
        try:
            p.kill()
        except psutil.Error:
            pass


def _lines_until(stream, pattern: str, timeout: float) -> re.Match:
    end = time.monotonic() + timeout
    seen = []
    while time.monotonic() < end:
        line = stream.readline()
        seen.append(line)
        m = re.search(pattern, line)
        if m:
            return m
    raise AssertionError(f"{pattern!r} not printed: {''.join(seen)[-2000:]}")


@pytest.mark.parametrize("lost", ["nodeB", "nodeA", "nodeA-doctor"])
def test_a_lost_node_is_the_root_cause(tmp_path, lost):
    """SIGKILL of one node's supervisor and ranks mid-run: the leader (nodeA) names the lost
    host and its ranks; when the leader itself is lost, nodeB names it and says so. SIGKILL of
    the leader's doctor alone ("nodeA-doctor"): its reaper stops its ranks (a job is never left
    unwatched), the follower goes on alone and explains the end, and replay of both nodes'
    directories gives the whole picture."""
    doctor_only = lost.endswith("-doctor")
    lost = lost.removesuffix("-doctor")
    out = tmp_path / "nodes"
    proc = nodes(out, ["--script", str(JOBS / "train_loop.py")],
                 {"STEPS": "600", "PAUSE": "0.05"}, wait=False)
    try:
        pids = {}
        for _ in HOSTS:
            m = _lines_until(proc.stderr, r"node \d+ host (\w+) pid (\d+)", 60)
            pids[m.group(1)] = int(m.group(2))
        _wait_for(lambda: len(list((out / lost).glob("rank*.ndcap"))) == 2, 120,
                  f"{lost}'s ranks")
        # the nodes have met (the follower says so once it joined: on a loaded host, loading
        # torch.distributed can take the node doctors longer than the ranks' start)
        joined = _lines_until(proc.stderr, r"joined the job's nodes", 120).string
        time.sleep(3)  # the job trains; the leader's word on its ranks has reached the follower
        if doctor_only:
            os.kill(_doctor_of(pids[lost]), 9)
        else:
            _kill_tree(pids[lost])
        _, err = proc.communicate(timeout=180)
        err = joined + err
    finally:
        if proc.poll() is None:
            proc.kill()
    _say_fallback(err)
    survivor = "nodeA" if lost == "nodeB" else "nodeB"
    rep = report(out, survivor)
    cause = root(rep)
    ranks = [2, 3] if lost == "nodeB" else [0, 1]
    assert cause["kind"] == "node_lost", (cause, err[-3000:])
    assert cause["ranks"] == ranks and cause["evidence"]["host"] == lost
    assert f"host {lost}" in cause["title"]
    assert rep["verdict"] == "crash"
    # the survivors' broken connections are consequences, not findings of their own
    assert not [f for f in rep["findings"] if f["kind"] == "missing_collective"]
    if lost == "nodeB":
        assert "LOST: nodeB" in err and rep["nodes"]["diagnosed_by"]["host"] == "nodeA"
        assert [n["state"] for n in rep["nodes"]["nodes"]] == ["ok", "lost"]
    else:
        assert "the leader (nodeA) was lost" in err
        assert any("the leader (nodeA) was lost" in n for n in rep["notes"])
    if doctor_only:  # the leader's reaper said why its ranks ended; replay joins both nodes
        whole = analyze(load(out / "nodeA", out / "nodeB"))
        assert sorted(r.rank for r in whole.ranks) == [0, 1, 2, 3]
        assert whole.root_cause.kind is FindingKind.NODE_LOST, whole.root_cause.title
        assert whole.root_cause.ranks == (0, 1) and whole.verdict is Verdict.CRASH
        assert any("the supervisor of nodeA (nccl-doctor run) was lost" in n
                   for n in whole.notes), whole.notes


@pytest.mark.parametrize("fixed", [False, True])
def test_the_node_seed_bug_across_hosts(tmp_path, fixed):
    out = tmp_path / "nodes"
    proc = nodes(out, ["-m", "nccl_doctor.reproducers.grpo_node_seed",
                       *(["--fixed"] if fixed else [])], {})
    assert proc.returncode == 0, proc.stderr[-3000:]
    a, b = report(out, "nodeA"), report(out, "nodeB")
    assert a == b
    if fixed:
        assert a["verdict"] == "ok", [f["title"] for f in a["findings"]]
        return
    found = {f["kind"]: f for f in a["findings"]}
    for kind in ("identical_completions", "shared_rng_state"):
        f = found[kind]
        assert f["evidence"]["classes"] == [[0, 1], [2, 3]]
        assert f["evidence"]["hosts"] == {"0": "nodeA", "1": "nodeA", "2": "nodeB", "3": "nodeB"}
        assert "ranks 0, 1 on nodeA; ranks 2, 3 on nodeB" in f["title"]
        assert "node 1 on nodeB (ranks 2, 3)" in f["detail"]
    assert a["verdict"] == "suspect"


def test_a_taken_coordinator_port_leaves_each_node_alone_and_the_job_unharmed(tmp_path):
    port = free_port()
    out = tmp_path / "nodes"
    with socket.socket() as taken:  # something else listens on the doctor's port
        taken.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        taken.bind(("0.0.0.0", doctor_port(port)))
        taken.listen()
        proc = nodes(out, ["--script", str(JOBS / "train_loop.py")], {"STEPS": "10"},
                     "--master-port", str(port))
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert f"cannot host the coordinator on port {doctor_port(port)}" in proc.stderr
    for host in HOSTS:
        rep = report(out, host)
        assert rep["verdict"] == "ok", [f["title"] for f in rep["findings"]]
        assert any("this report covers this node's ranks only" in n for n in rep["notes"])
        assert {r["host"] for r in rep["ranks"] if r["state"] != "no_capture"} == {host}


def test_the_leader_serves_the_whole_job(tmp_path):
    """``run --serve`` on each node: the leader's endpoint holds every node's ranks, the nodes
    joined and the culprit on the other host, and keeps the final report up for a scrape."""
    import urllib.request

    out = tmp_path / "nodes"
    proc = nodes(out, ["--script", str(JOBS / "skip_broadcast.py")], {"SKIPPER": "3"},
                 "--doctor-args", "--serve 127.0.0.1:0 --serve-linger 15", wait=False)
    statuses = {}
    try:
        for _ in HOSTS:
            m = _lines_until(proc.stderr, r"serving the final report at (http://\S+/)", 180)
            with urllib.request.urlopen(m.group(1) + "status.json", timeout=10) as r:
                status = json.loads(r.read())
            with urllib.request.urlopen(m.group(1) + "metrics", timeout=10) as r:
                metrics = r.read().decode()
            statuses[status["nodes"].get("joined")] = (status, metrics)
        proc.communicate(timeout=120)  # the endpoints end after their linger
    finally:
        if proc.poll() is None:
            _kill_tree(proc.pid)
    leader, metrics = statuses[2]  # the follower's says only its own node
    assert (leader["state"], leader["phase"], leader["verdict"]) == ("done", "hang", "hang")
    assert leader["nodes"] == {"joined": 2, "lost": 0, "expected": 2}
    assert {r["rank"]: (r["host"], r["state"], r["detail"]) for r in leader["ranks"]} == {
        0: ("nodeA", "ended", "stopped"), 1: ("nodeA", "ended", "stopped"),
        2: ("nodeB", "ended", "stopped"), 3: ("nodeB", "ended", "stopped")}
    assert leader["root_cause"]["ranks"] == [3]
    cause = [line for line in metrics.splitlines() if line.startswith("nccl_doctor_root_cause{")]
    assert cause and all('callsite="' in line and 'host="nodeB"' in line for line in cause), cause
    assert 'nccl_doctor_nodes{state="joined"} 2.0' in metrics
    assert json.loads((out / "nodeA" / "report.json").read_text())["verdict"] == "hang"


@pytest.mark.parametrize("killed", ["doctor", "node"])
def test_followers_go_on_watching_their_own_ranks_once_the_leader_is_lost(tmp_path, killed):
    """The leader's doctor is SIGKILLed (its reaper stops its ranks), or its whole node (the
    doctor and its ranks at once); then the follower's own ranks deadlock in a group of their
    own. The follower says the leader was lost, calls the deadlock itself, stops its job and
    writes its node report; replay of both nodes' directories names the lost node and the
    deadlock."""
    out, flags = tmp_path / "nodes", tmp_path / "flags"
    flags.mkdir()
    proc = nodes(out, ["--script", str(JOBS / "follower_hang.py")], {"FLAG_DIR": str(flags)},
                 wait=False)
    try:
        pids = {}
        for _ in HOSTS:
            m = _lines_until(proc.stderr, r"node \d+ host (\w+) pid (\d+)", 60)
            pids[m.group(1)] = int(m.group(2))
        _wait_for(lambda: len(list((out / "nodeB").glob("rank*.ndcap"))) == 2, 120,
                  "nodeB's ranks")
        joined = _lines_until(proc.stderr, r"joined the job's nodes", 120).string
        time.sleep(3)
        if killed == "doctor":
            os.kill(_doctor_of(pids["nodeA"]), 9)  # the leader's doctor alone
            _wait_for(lambda: (out / "nodeA" / "watchdog.json").is_file(), 60,
                      "the leader's reaper's record")
        else:
            _kill_tree(pids["nodeA"])  # the node: its doctor and its ranks at once
        time.sleep(2)
        (flags / "go").touch()  # now node 1's ranks deadlock among themselves
        _, err = proc.communicate(timeout=180)
        err = joined + err
    finally:
        if proc.poll() is None:
            _kill_tree(proc.pid)
            proc.communicate()
    _say_fallback(err)
    assert "the leader (nodeA) was lost" in err, err[-3000:]
    rep = report(out, "nodeB")
    # the follower called the deadlock on its own ranks and stopped them; its report also
    # says what it saw first: the leader's node lost
    assert rep["verdict"] == "hang" and rep["watchdog"]["situation"] == "deadlock", err[-3000:]
    found = {f["kind"]: f for f in rep["findings"]}
    mismatch = found["collective_mismatch"]
    assert mismatch["ranks"] == [3] and "broadcast" in mismatch["title"], mismatch["title"]
    assert found["node_lost"]["ranks"] == [0, 1]
    assert {r["rank"]: r["state"] for r in rep["ranks"]} == {0: "lost", 1: "lost", 2: "stopped",
                                                            3: "stopped"}
    assert any("the leader (nodeA) was lost" in n for n in rep["notes"])
    whole = analyze(load(out / "nodeA", out / "nodeB"))
    kinds = {f.kind for f in whole.findings}
    assert FindingKind.NODE_LOST in kinds and FindingKind.COLLECTIVE_MISMATCH in kinds, \
        [f.title for f in whole.findings]
