"""A real Ray cluster of two nodes on this machine - a head (nodeA) and a worker node (nodeB),
each started with `ray start` in a UTS namespace of its own, as the multi-node tests simulate
hosts - and an RLHF-shaped job on it (ray_jobs/ray_cluster_job.py: Trainer actors on nodeA, Engine
actors on nodeB, a trainers' group and a weight-sync group), run as a user runs a driver on such
a cluster: `nccl-doctor run --ray -- python driver.py`, nothing else changed. The Ray workers of
nodeB were started by nodeB's raylet, not by anything the doctor launched: their recorder comes
from Ray's runtime_env hook, and nodeB's doctor is an actor Ray scheduled there."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import psutil
import pytest

from nccl_doctor.capture.names import node_dir
from nccl_doctor.reproducers.nodes import free_port, namespaces_work

JOBS = Path(__file__).parent / "ray_jobs"
JOB = JOBS / "ray_cluster_job.py"
RAY = Path(sys.executable).with_name("ray")
QUIET = {"RAY_AUTH_MODE": "disabled", "RAY_USAGE_STATS_ENABLED": "0", "RAY_DEDUP_LOGS": "0"}

pytestmark = pytest.mark.upstream  # one worker runs them (tests/conftest.py SHARED)


class Node:
    """One `ray start` node in a UTS namespace of its own (or, where namespaces are refused,
    named through NCCL_DOCTOR_HOSTNAME); a process kept in the namespace names it."""

    def __init__(self, host: str, args: list[str], tmp: Path, uts: bool) -> None:
        self.host, self.uts = host, uts
        env = dict(os.environ, **QUIET)
        self.up = tmp / f"{host}.up"
        start = [str(RAY), "start", "--node-ip-address=127.0.0.1", "--num-cpus=2",
                 f'--resources={{"{host}": 8}}', "--disable-usage-stats", *args]
        if uts:
            # the namespace's keeper: `ray start` daemonises, the sleep stays to name the node
            script = f'hostname "$0" && "$@" >&2 && touch {self.up} && exec sleep 100000'
            self.keeper = subprocess.Popen(["unshare", "-u", "sh", "-c", script, host, *start],
                                           env=env, stdout=subprocess.DEVNULL,
                                           stderr=open(tmp / f"{host}.log", "w"))
        else:
            env["NCCL_DOCTOR_HOSTNAME"] = host
            self.keeper = subprocess.Popen(["sh", "-c", f'"$@" >&2 && touch {self.up} && exec '
                                            'sleep 100000', "sh", *start], env=env, stdout=subprocess.DEVNULL,
                                           stderr=open(tmp / f"{host}.log", "w"))

    def wait_up(self, timeout: float = 120) -> None:
        """Until `ray start` returned (it failed: the keeper is gone)."""
        deadline = time.monotonic() + timeout
        while not self.up.exists():
            assert self.keeper.poll() is None and time.monotonic() < deadline, \
                f"ray start of {self.host} failed"
            time.sleep(0.2)

    def processes(self) -> list[psutil.Process]:
        """The node's processes: its namespace's (or those with its NCCL_DOCTOR_HOSTNAME)."""
        mine = []
        ns = os.readlink(f"/proc/{self.keeper.pid}/ns/uts") if self.uts else None
        for p in psutil.process_iter():
            try:
                if p.pid == self.keeper.pid:
                    continue
                if ns is not None and os.readlink(f"/proc/{p.pid}/ns/uts") == ns:
                    mine.append(p)
                elif ns is None and p.environ().get("NCCL_DOCTOR_HOSTNAME") == self.host:
                    mine.append(p)
            except (psutil.Error, OSError):
                continue
        return mine

    def kill(self) -> None:
        """The node dies: every process of it, at once (SIGKILL)."""
        for p in self.processes():
            try:
                p.send_signal(signal.SIGKILL)
            except psutil.Error:
                pass

    def stop(self) -> None:
        self.kill()
        self.keeper.kill()
        self.keeper.wait()


class Cluster:
    def __init__(self, tmp: Path) -> None:
        self.tmp, self.port = tmp, free_port()
        self.address = f"127.0.0.1:{self.port}"
        self.uts, why = namespaces_work()
        print("UTS namespaces:", "available" if self.uts else f"refused ({why})")
        self.nodes: dict[str, Node] = {}
        t0 = time.monotonic()
        # Ray's own files: a short path (its sockets' names must fit in 107 bytes)
        self.ray_tmp = tempfile.mkdtemp(prefix="ndr-")
        self.add("nodeA", ["--head", f"--port={self.port}", "--include-dashboard=false",
                           f"--temp-dir={self.ray_tmp}"], count=1)
        self.add("nodeB", [f"--address={self.address}"], count=2)
        print(f"Ray cluster of 2 nodes up in {time.monotonic() - t0:.1f} s")

    def add(self, host: str, args: list[str], count: int) -> Node:
        node = self.nodes[host] = Node(host, args, self.tmp, self.uts)
        node.wait_up()
        self.wait_nodes(count)
        return node

    def alive(self) -> int:
        probe = ("import ray, sys; ray.init(address=sys.argv[1], logging_level='ERROR'); "
                 "print(sum(1 for n in ray.nodes() if n['Alive']))")
        proc = subprocess.run([sys.executable, "-c", probe, self.address], capture_output=True,
                              text=True, timeout=120, env=dict(os.environ, **QUIET))
        return int(proc.stdout.strip() or 0) if proc.returncode == 0 else 0

    def wait_nodes(self, count: int, timeout: float = 120) -> None:
        deadline = time.monotonic() + timeout
        while self.alive() < count:
            assert time.monotonic() < deadline, f"the Ray cluster never had {count} nodes: " + \
                "".join((self.tmp / f"{h}.log").read_text()[-2000:] for h in self.nodes)
            time.sleep(1)

    def run(self, out: Path, *args: str, wait: bool = True, job: Path = JOB,
            doctor_args: tuple[str, ...] = ()):
        """`nccl-doctor run --ray` around the driver, on nodeA (where the driver runs)."""
        doctor = [sys.executable, "-m", "nccl_doctor", "run", "--ray", self.address, "--out",
                  str(out), "--no-gpu", *doctor_args, "--", sys.executable, str(job), *args]
        env = dict(os.environ, **QUIET)
        if self.uts:
            command = ["unshare", "-u", "sh", "-c", 'hostname nodeA && exec "$@"', "sh", *doctor]
        else:
            command, env["NCCL_DOCTOR_HOSTNAME"] = doctor, "nodeA"
        proc = subprocess.Popen(command, env=env, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True)
        if not wait:
            return proc
        stdout, stderr = proc.communicate(timeout=400)
        return subprocess.CompletedProcess(command, proc.returncode, stdout, stderr)

    def stop(self) -> None:
        for node in self.nodes.values():
            node.stop()
        shutil.rmtree(self.ray_tmp, ignore_errors=True)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    c = Cluster(tmp_path_factory.mktemp("ray-cluster"))
    yield c
    c.stop()


def reports(out: Path, *hosts: str) -> list[dict]:
    return [json.loads((d / "report.json").read_text())
            for d in [out, *(node_dir(out, h) for h in hosts)]]


def replayed(out: Path, *hosts: str) -> dict:
    dirs = [str(out), *(str(node_dir(out, h)) for h in hosts)]
    proc = subprocess.run([sys.executable, "-m", "nccl_doctor", "replay", "--format", "json",
                           *dirs], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return json.loads(proc.stdout)


def root(report: dict) -> dict:
    return next(f for f in report["findings"] if f["root_cause"])


def line_of(text: str) -> str:
    n = next(i for i, ln in enumerate(JOB.read_text().splitlines(), 1) if text in ln)
    return f"ray_cluster_job.py:{n}"


def no_doctor_left() -> list[str]:
    """The doctor's own processes (its keeper, node doctors' supervisors, node jobs) still
    alive after the run."""
    left = []
    for p in psutil.process_iter(["cmdline"]):
        cmd = " ".join(p.info["cmdline"] or [])
        if "nccl_doctor.supervisor.ray" in cmd and p.status() != psutil.STATUS_ZOMBIE:
            left.append(f"{p.pid} {cmd[:160]}")
    return left


def test_a_healthy_job_on_two_nodes_reads_ok_on_both(cluster, tmp_path):
    out = tmp_path / "out"
    proc = cluster.run(out)
    assert proc.returncode == 0, proc.stderr[-3000:]
    leader, follower = reports(out, "nodeB")
    assert leader == follower  # the same report on both nodes
    assert leader["verdict"] == "ok" and leader["findings"] == [], leader["findings"]
    # the node doctors got the job's key through Ray (their actors' runtime_env)
    assert leader["nodes"]["authenticated"] is True and "rejected" not in leader["nodes"]
    assert leader["nodes"]["key"] == "a key made for this run and handed to its node doctors"
    assert leader["notes"] == [], leader["notes"]  # no warning, no note
    assert [(r["rank"], r["host"]) for r in leader["ranks"]] == [
        (0, "nodeA"), (1, "nodeA"), (2, "nodeB"), (3, "nodeB")]
    # nodeB's ranks were recorded on nodeB, in its node doctor's directory
    assert len(list(node_dir(out, "nodeB").glob("rank0000[23].nodeB.*.ndcap"))) == 2
    assert len(list(out.glob("rank0000[01].nodeA.*.ndcap"))) == 2
    nodes = leader["nodes"]["nodes"]
    assert [(n["host"], n["role"], n["ranks"]) for n in nodes] == [
        ("nodeA", "leader", [0, 1]), ("nodeB", "follower", [2, 3])]
    actors = leader["ray"]["actors"]
    assert [actors[str(r)]["class"] for r in range(4)] == ["Trainer"] * 2 + ["Engine"] * 2
    assert len({a["id"] for a in actors.values()}) == 4
    roles = {g["role"] for g in leader["ray"]["groups"].values()}
    assert "weight-sync group (Trainer rank 0 -> Engine ranks 2, 3)" in roles
    assert "Trainer group (ranks 0, 1)" in roles
    assert replayed(out, "nodeB")["verdict"] == "ok"
    assert not no_doctor_left()
    assert cluster.alive() == 2  # the cluster it did not start is left as it was


def test_a_skipped_weight_sync_on_the_worker_node_names_its_rank_host_line_and_actor(
        cluster, tmp_path):
    out = tmp_path / "out"
    proc = cluster.run(out, "--fault", "skip_broadcast")
    assert proc.returncode == 124, proc.stderr[-3000:]
    leader, follower = reports(out, "nodeB")
    assert leader == follower
    assert leader["verdict"] == "hang"
    cause = root(leader)
    assert cause["kind"] == "missing_collective" and cause["ranks"] == [3], cause["title"]
    assert cause["op"] == "broadcast" and cause["group"] == "2"
    assert cause["callsite"].endswith(line_of("# the weight sync"))
    assert cause["evidence"]["hosts"] == {"3": "nodeB"}
    assert cause["evidence"]["actors"]["3"].startswith("Engine ")
    assert cause["evidence"]["group_role"] == \
        "weight-sync group (Trainer rank 0 -> Engine ranks 2, 3)"
    assert "[rank 3 (Engine " in cause["title"] and "on nodeB" in cause["title"]
    # called within seconds of the last rank blocking
    assert leader["watchdog"]["waited_s"] < 10, leader["watchdog"]
    # rank 3's own stack, sampled on nodeB: the actor's main thread, in the barrier it went on to
    r3 = leader["ranks"][3]
    assert r3["host"] == "nodeB" and line_of("# the step's end") in r3["stack_summary"], r3
    main = [c for c in leader["stack_classes"] if 3 in c["ranks"]][0]
    assert any(f.endswith("Worker.main_loop") for f in main["frames"]), main
    again = root(replayed(out, "nodeB"))
    assert {k: again[k] for k in ("kind", "ranks", "group", "seq", "callsite")} == \
        {k: cause[k] for k in ("kind", "ranks", "group", "seq", "callsite")}
    assert not no_doctor_left()


def test_a_shape_mismatch_inside_the_weight_sync_group(cluster, tmp_path):
    out = tmp_path / "out"
    proc = cluster.run(out, "--fault", "sync_shape")
    assert proc.returncode in (1, 124), proc.stderr[-3000:]  # gloo may abort on the sizes
    leader, follower = reports(out, "nodeB")
    assert leader == follower
    cause = root(leader)
    assert cause["kind"] == "collective_mismatch" and cause["group"] == "2", cause["title"]
    sides = {tuple(s["ranks"]): s for s in cause["evidence"]["sides"]}
    assert sides[(3,)]["input"] == "float32[4]" and sides[(0, 2)]["input"] == "float32[8]"
    assert cause["evidence"]["group_role"] == \
        "weight-sync group (Trainer rank 0 -> Engine ranks 2, 3)"
    assert cause["evidence"]["hosts"]["3"] == "nodeB"
    assert root(replayed(out, "nodeB"))["kind"] == "collective_mismatch"


def test_ray_train_on_two_nodes_names_the_rank_its_host_and_the_training_thread(
        cluster, tmp_path):
    """A TorchTrainer whose two workers Ray spreads over the nodes; world rank 1 skips a
    broadcast. The collective runs on Ray Train's TrainingThread, not the actor's main one."""
    out = tmp_path / "out"
    proc = cluster.run(out, "--address", cluster.address, "--spread",
                       job=JOBS / "ray_train_skip_broadcast.py")
    assert proc.returncode == 124, proc.stderr[-3000:]
    leader = json.loads((out / "report.json").read_text())
    hosts = {r["rank"]: r["host"] for r in leader["ranks"]}
    assert sorted(hosts.values()) == ["nodeA", "nodeB"], hosts  # one worker on each node
    other = [h for h in hosts.values() if h != "nodeA"][0]
    assert json.loads((node_dir(out, other) / "report.json").read_text()) == leader
    cause = root(leader)
    assert cause["kind"] == "collective_mismatch", cause["title"]
    sides = {tuple(s["ranks"]): s for s in cause["evidence"]["sides"]}
    assert sides[(0,)]["op"] == "broadcast" and sides[(1,)]["op"] == "barrier"
    assert all("ray_train_skip_broadcast.py:" in s["callsite"] for s in sides.values())
    assert f"on {hosts[1]}" in cause["title"] and "RayTrainWorker" in cause["title"]
    for r in leader["ranks"]:  # each rank's stack: the collective's thread, sampled on its node
        assert "on thread 'TrainingThread" in r["stack_summary"], r
        assert "ray_train_skip_broadcast.py" in r["stack_summary"], r
    assert leader["watchdog"]["waited_s"] < 10, leader["watchdog"]
    assert not no_doctor_left()


def test_a_node_doctor_refused_its_directory_is_said_and_the_job_goes_on(cluster, tmp_path):
    """nodeB's directory is held by another live run: nodeB's doctor is refused (exit 11); the
    leader says so and the job runs to its end, nodeB's ranks unseen, never blamed."""
    out = tmp_path / "out"
    holder = subprocess.Popen([sys.executable, "-m", "nccl_doctor", "run", "--quiet", "--no-gpu",
                               "--out", str(node_dir(out, "nodeB")), "--", "sleep", "300"])
    try:
        deadline = time.monotonic() + 60
        while not (node_dir(out, "nodeB") / ".nccl-doctor.lock").exists():
            assert time.monotonic() < deadline and holder.poll() is None, "the holder's lock"
            time.sleep(0.2)
        proc = cluster.run(out)
    finally:
        holder.terminate()
        holder.wait(60)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "the node doctor on nodeB ended early (exit 11" in proc.stderr, proc.stderr[-3000:]
    leader = json.loads((out / "report.json").read_text())
    assert leader["verdict"] == "ok" and leader["findings"] == [], leader["findings"]
    assert {r["rank"]: r["exit_detail"] for r in leader["ranks"] if r["host"] != "nodeA"} == {
        2: "on another host, not seen here", 3: "on another host, not seen here"}
    assert not no_doctor_left()


def _joined(port: int) -> int:
    """The nodes the leader counts as joined (its ``--serve`` endpoint; 0 while it is not up)."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/status.json", timeout=2) as r:
            return int(json.loads(r.read())["nodes"].get("joined", 0))
    except (OSError, ValueError):
        return 0


def test_a_node_killed_mid_run_is_the_root_cause(cluster, tmp_path):
    node = cluster.add("nodeC", [f"--address={cluster.address}"], count=3)
    out = tmp_path / "out"
    port = free_port()  # the leader's endpoint says when nodeC's doctor has joined
    proc = cluster.run(out, "--fault", "stall", "--engines", "nodeC,nodeC", wait=False,
                       doctor_args=("--serve", f"127.0.0.1:{port}", "--serve-linger", "0"))
    try:
        deadline = time.monotonic() + 180
        while len(list(node_dir(out, "nodeC").glob("rank*.ndcap"))) < 2 or \
                _joined(port) < 3:
            assert time.monotonic() < deadline and proc.poll() is None, "nodeC's ranks and doctor"
            time.sleep(0.5)
        time.sleep(3)  # the ranks meet the barrier, rank 3 sleeps
        node.kill()
        _, stderr = proc.communicate(timeout=300)
    finally:
        if proc.poll() is None:
            proc.kill()
    leader = json.loads((out / "report.json").read_text())
    cause = root(leader)
    assert cause["kind"] == "node_lost", (cause["title"], stderr[-3000:])
    assert cause["ranks"] == [2, 3] and cause["evidence"]["host"] == "nodeC"
    assert "LOST: nodeC" in stderr
    states = {n["host"]: n["state"] for n in leader["nodes"]["nodes"]}
    assert states["nodeC"] == "lost" and states["nodeA"] == "ok"
    assert not no_doctor_left()
