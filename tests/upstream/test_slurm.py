"""`nccl-doctor run -- srun ...` inside a real Slurm allocation (slurm_cluster.py: slurmctld, a
slurmd in each of two UTS namespaces nodeA and nodeB, munged): Slurm itself starts a node doctor
on the other node (an overlapping step), the federation gives one diagnosis - the same report on
both nodes - and a hang stops the job's step through Slurm, leaving nothing on either node. Both
launch styles (torchrun per node; one Slurm task per rank) and both places the doctor runs (an
sbatch script on the allocation's first node; salloc's shell outside the allocation). The sbatch
scripts are docs/examples/slurm's, run as the docs show them."""

from __future__ import annotations

import json
import re
import shlex
import subprocess
import sys
import time
from pathlib import Path

import pytest

from nccl_doctor.capture.names import node_dir
from nccl_doctor.errors import ExitStatus
from nccl_doctor.reproducers.nodes import free_port
from slurm_cluster import SlurmCluster

pytestmark = pytest.mark.upstream  # one worker runs them (tests/conftest.py SHARED)

ROOT = Path(__file__).resolve().parents[2]
JOBS = ROOT / "tests" / "integration" / "jobs"
SCRIPTS = ROOT / "docs" / "examples" / "slurm"
DOCTOR = str(Path(sys.executable).with_name("nccl-doctor"))
PY = sys.executable


@pytest.fixture(scope="module")
def slurm(tmp_path_factory):
    cluster = SlurmCluster.up(lambda: tmp_path_factory.mktemp("slurm"))
    try:
        yield cluster
    finally:
        cluster.stop()
    assert not cluster.leftovers(), cluster.leftovers()


def sbatch(slurm: SlurmCluster, script: Path, out: Path, env: dict[str, str],
           *options: str, status: int = 0) -> str:
    """Submit a docs script (its variables set) and wait for its end (its exit status must be
    ``status``: the doctor's); its output. (``sbatch --wait`` polls every 10 s: this asks
    ``scontrol`` every 0.5 s.)"""
    log = out.parent / f"{out.name}.log"
    settings = {"NCCL_DOCTOR": DOCTOR, "PYTHON": PY, "OUT": str(out),
                "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port()), **env}
    proc = slurm.run(["sbatch", "-o", str(log), *options, str(script)], timeout=60, env=settings)
    found = re.search(r"Submitted batch job (\d+)", proc.stdout)
    assert found, (proc.stdout, proc.stderr)
    job = finished(slurm, found.group(1), 400)
    text = log.read_text() if log.exists() else ""
    assert job.get("ExitCode") == f"{status}:0", (job, text[-3000:])
    return text


def finished(slurm: SlurmCluster, job_id: str, timeout: float) -> dict[str, str]:
    """The batch job's record once it ended (``scontrol show job``)."""
    deadline = time.monotonic() + timeout
    while True:
        records = slurm.show("job", job_id)
        if records and records[0].get("JobState") not in ("PENDING", "RUNNING", "CONFIGURING",
                                                          "COMPLETING"):
            return records[0]
        assert time.monotonic() < deadline, f"job {job_id} still running: {records}"
        time.sleep(0.5)


def reports(out: Path, *hosts: str) -> list[dict]:
    return [json.loads((d / "report.json").read_text())
            for d in [out, *(node_dir(out, h) for h in hosts)]]


def replayed(out: Path, *hosts: str) -> dict:
    proc = subprocess.run([PY, "-m", "nccl_doctor", "replay", "--format", "json", str(out),
                           *(str(node_dir(out, h)) for h in hosts)],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return json.loads(proc.stdout)


def root(report: dict) -> dict:
    return next(f for f in report["findings"] if f["root_cause"])


def line_of(path: Path, text: str) -> str:
    n = next(i for i, ln in enumerate(path.read_text().splitlines(), 1) if text in ln)
    return f"{path.name}:{n}"


def job_processes(slurm: SlurmCluster, host: str) -> list[str]:
    """What of the job and its doctors still runs on ``host``."""
    left = []
    for p in slurm.node_processes(host):
        try:
            cmd = " ".join(p.cmdline())
        except Exception:  # noqa: BLE001 - gone meanwhile
            continue
        if "nccl_doctor" in cmd or "jobs/" in cmd or "torch.distributed.run" in cmd:
            left.append(f"{p.pid} {cmd[:160]}")
    return left


def no_job_left(slurm: SlurmCluster) -> None:
    deadline = time.monotonic() + 20
    while any(job_processes(slurm, h) for h in slurm.hosts) and time.monotonic() < deadline:
        time.sleep(0.5)
    for host in slurm.hosts:
        assert not job_processes(slurm, host), (host, job_processes(slurm, host))


# -- torchrun per node -------------------------------------------------------------------------
def test_torchrun_per_node_healthy_one_report_on_both_nodes(slurm, tmp_path):
    out = tmp_path / "out"
    log = sbatch(slurm, SCRIPTS / "torchrun-per-node.sbatch", out,
                 {"TRAIN": str(JOBS / "slow_node.py"), "NPROC": "2"}, "--cpus-per-task=2")
    assert "Slurm: a node doctor runs on nodeB (node 1)" in log, log[-3000:]
    leader, follower = reports(out, "nodeB")
    assert leader == follower, log[-3000:]
    assert leader["verdict"] == "ok" and leader["findings"] == [], log[-3000:]
    hosts = {r["rank"]: r["host"] for r in leader["ranks"]}
    assert hosts == {0: "nodeA", 1: "nodeA", 2: "nodeB", 3: "nodeB"}
    nodes = leader["nodes"]
    assert nodes["rendezvous"].startswith("Slurm allocation") and nodes["authenticated"] is True
    assert nodes["key"] == "a key made for this run and handed to its node doctors", nodes
    assert [n["state"] for n in nodes["nodes"]] == ["ok", "ended"]
    no_job_left(slurm)


def test_torchrun_per_node_hang_on_node_2_is_named_and_the_step_cancelled(slurm, tmp_path):
    out = tmp_path / "out"
    log = sbatch(slurm, SCRIPTS / "torchrun-per-node.sbatch", out,
                 {"TRAIN": str(JOBS / "skip_broadcast.py"), "NPROC": "2", "SKIPPER": "3"},
                 "--cpus-per-task=2", status=ExitStatus.HANG_STOPPED)
    leader, follower = reports(out, "nodeB")
    assert leader == follower, log[-3000:]
    assert leader["verdict"] == "hang", log[-3000:]
    cause = root(leader)
    assert cause["ranks"] == [3] and cause["kind"] in ("collective_mismatch", "missing_collective"), cause
    assert line_of(JOBS / "skip_broadcast.py", "if step == 2 and rank == skipper") in \
        json.dumps(cause)
    # stopped: each node's ranks asked to exit, the step cancelled through Slurm if still there;
    # nothing left on either node
    assert "stopped the job" in log or re.search(r"STEP \d+\.\d+ .*CANCELLED", log), log[-3000:]
    no_job_left(slurm)
    assert root(replayed(out, "nodeB"))["ranks"] == [3]


def test_a_node_killed_mid_run_is_named_and_nothing_is_left(slurm, tmp_path):
    out = tmp_path / "out"
    log_path = tmp_path / "out.log"
    settings = {"NCCL_DOCTOR": DOCTOR, "PYTHON": PY, "OUT": str(out), "MASTER_ADDR": "127.0.0.1",
                "MASTER_PORT": str(free_port()), "TRAIN": str(JOBS / "slow_node.py"),
                "NPROC": "2", "STEPS": "400", "PAUSE": "0.2"}
    job = slurm.run(["sbatch", "--no-kill", "--cpus-per-task=2", "-o", str(log_path),
                     str(SCRIPTS / "torchrun-per-node.sbatch")], timeout=60, env=settings)
    job_id = re.search(r"Submitted batch job (\d+)", job.stdout).group(1)
    try:
        deadline = time.monotonic() + 120
        while len(list(node_dir(out, "nodeB").glob("rank*.ndcap"))) < 2:
            assert time.monotonic() < deadline, log_path.read_text()[-3000:]
            time.sleep(0.5)
        time.sleep(4)  # the ranks train; nodeB's doctor beats
        slurm.kill_node("nodeB")
        finished(slurm, job_id, 300)
    finally:
        slurm.run(["scancel", job_id])
        slurm.start_node("nodeB")
        slurm.wait_up(120)
    log = log_path.read_text()
    leader = json.loads((out / "report.json").read_text())
    cause = root(leader)
    assert cause["kind"] in ("node_lost", "rank_exited", "crash"), (cause["title"], log[-3000:])
    assert sorted(cause["ranks"]) == [2, 3], cause["title"]
    assert "LOST: nodeB" in log, log[-3000:]
    states = {n["host"]: n["state"] for n in leader["nodes"]["nodes"]}
    assert states == {"nodeA": "ok", "nodeB": "lost"}
    no_job_left(slurm)


# -- one Slurm task per rank ---------------------------------------------------------------------
def test_task_per_rank_healthy_by_the_docs_script(slurm, tmp_path):
    out = tmp_path / "out"
    log = sbatch(slurm, SCRIPTS / "task-per-rank.sbatch", out,
                 {"TRAIN": str(JOBS / "slow_node.py"), "STEPS": "10"}, "--ntasks-per-node=2")
    leader, follower = reports(out, "nodeB")
    assert leader == follower and leader["verdict"] == "ok", log[-3000:]
    assert sorted(r["rank"] for r in leader["ranks"]) == [0, 1, 2, 3]
    no_job_left(slurm)


def test_task_per_rank_hang_from_salloc_outside_the_allocation(slurm, tmp_path):
    """salloc's shell runs where salloc was typed (this host, not a node of the allocation):
    the doctor there leads, and Slurm runs a node doctor on both nodes."""
    out = tmp_path / "out"
    port = free_port()
    inner = (f"{shlex.quote(DOCTOR)} run --out {shlex.quote(str(out))} -- srun bash -c "
             + shlex.quote(f"RANK=$SLURM_PROCID WORLD_SIZE=$SLURM_NTASKS exec {PY} "
                           f"{JOBS / 'skip_broadcast.py'}"))
    proc = slurm.run(["salloc", "-N2", "--ntasks-per-node=2", "bash", "-c", inner], timeout=400,
                     env={"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "SKIPPER": "2"})
    assert proc.returncode == ExitStatus.HANG_STOPPED, proc.stderr[-3000:]
    assert "a node doctor runs on nodeA (node 1)" in proc.stderr
    assert "a node doctor runs on nodeB (node 2)" in proc.stderr
    here, a, b = reports(out, "nodeA", "nodeB")
    assert here == a == b
    cause = root(here)
    assert cause["ranks"] == [2], cause["title"]
    assert {r["host"] for r in here["ranks"]} == {"nodeA", "nodeB"}
    no_job_left(slurm)


def test_a_slow_node_through_slurm(slurm, tmp_path):
    out = tmp_path / "out"
    log = sbatch(slurm, SCRIPTS / "task-per-rank.sbatch", out,
                 {"TRAIN": str(JOBS / "slow_node.py"), "STEPS": "20", "SLOW_HOST": "nodeB",
                  "SLOW_SECONDS": "0.3"}, "--ntasks-per-node=2")
    leader, follower = reports(out, "nodeB")
    assert leader == follower, log[-3000:]
    (found,) = [f for f in leader["findings"] if f["kind"] == "straggler"]
    node = found["evidence"]["node"]
    assert node["host"] == "nodeB" and node["ranks"] == [2, 3], found["title"]
    assert 0.225 <= node["per_step_s"] <= 0.375 and node["cost_per_step_s"] > 0.2, node
    no_job_left(slurm)


def test_an_allocation_of_this_node_alone_needs_no_node_doctor(slurm, tmp_path):
    """salloc -N1 on nodeA, the doctor there: no other node, so no node doctors' step and no
    coordinator; the ranks Slurm started are still the doctor's, and a hang still cancels the
    step."""
    out = tmp_path / "out"
    inner = (f"{shlex.quote(DOCTOR)} run --no-gpu --out {shlex.quote(str(out))} -- srun bash -c "
             + shlex.quote(f"RANK=$SLURM_PROCID WORLD_SIZE=$SLURM_NTASKS exec {PY} "
                           f"{JOBS / 'skip_broadcast.py'}"))
    proc = slurm.run(["salloc", "-N1", "-w", "nodeA", "--ntasks-per-node=2", "bash", "-c", inner],
                     host="nodeA", timeout=300,
                     env={"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port()),
                          "SKIPPER": "1"})
    assert proc.returncode == ExitStatus.HANG_STOPPED, proc.stderr[-3000:]
    assert "node doctor" not in proc.stderr and "coordinating" not in proc.stderr
    rep = json.loads((out / "report.json").read_text())
    assert root(rep)["ranks"] == [1]
    assert not rep.get("nodes"), rep.get("nodes")
    no_job_left(slurm)


def test_stopping_cancels_the_jobs_own_steps_on_every_node_and_no_other(slurm, tmp_path,
                                                                        monkeypatch):
    """What a hang's stop does when the step is still there after the ranks were asked to exit
    (a rank that did not answer, a node whose doctor is gone): ``scancel`` of the steps whose
    srun is a process of the job - not another step of the same allocation."""
    from types import SimpleNamespace

    from nccl_doctor.supervisor.slurm.allocation import Allocation, steps
    from nccl_doctor.supervisor.slurm.fleet import SlurmFleet, SlurmRun

    for name, value in slurm.env().items():
        if name.startswith("SLURM_"):
            monkeypatch.setenv(name, value)
    proc = slurm.run(["salloc", "-N2", "--no-shell"], timeout=60)
    job_id = re.search(r"Granted job allocation (\d+)", proc.stderr).group(1)
    env = slurm.env()
    try:
        ours = subprocess.Popen(["bash", "-c", f"srun --jobid={job_id} -N2 --overlap sleep 301"],
                                env=env)
        other = subprocess.Popen(["srun", f"--jobid={job_id}", "-N2", "--overlap", "sleep", "302"],
                                 env=env)
        deadline = time.monotonic() + 60
        while len(steps(job_id)) < 2:
            assert time.monotonic() < deadline, steps(job_id)
            time.sleep(0.2)
        fleet = SlurmFleet(SlurmRun(Allocation(job_id, ("nodeA", "nodeB")), 0, (), "nowhere"),
                           tmp_path / "out", None)
        fleet.start(SimpleNamespace(job=SimpleNamespace(pid=ours.pid)))
        fleet.stopping(15)
        assert ours.wait(60) != 0  # its step cancelled: srun ends
        left = steps(job_id)
        assert [s.srun_pid for s in left] == [other.pid], left
        for host in slurm.hosts:
            cmds = [" ".join(p.cmdline()) for p in slurm.node_processes(host)]
            assert not any("sleep 301" in c for c in cmds), (host, cmds)
            assert any("sleep 302" in c for c in cmds), (host, cmds)
    finally:
        slurm.run(["scancel", job_id])
        for p in (ours, other):
            p.wait(60)


# -- a job's end that is Slurm's doing ------------------------------------------------------------
def training(slurm: SlurmCluster, tmp_path: Path, steps: int, *options: str
             ) -> tuple[str, Path, Path]:
    """A healthy 2-rank job of ``steps`` steps submitted by the docs' task-per-rank script
    (``options``: sbatch's); (its id, its --out, its log) once its ranks train."""
    out, log_path = tmp_path / "out", tmp_path / "job.log"
    settings = {"NCCL_DOCTOR": DOCTOR, "PYTHON": PY, "OUT": str(out), "MASTER_ADDR": "127.0.0.1",
                "MASTER_PORT": str(free_port()), "TRAIN": str(JOBS / "train_loop.py"),
                "STEPS": str(steps), "PAUSE": "0.05"}
    job = slurm.run(["sbatch", "--nodes=1", "--ntasks-per-node=2", "-o", str(log_path),
                     *options, str(SCRIPTS / "task-per-rank.sbatch")], timeout=60, env=settings)
    found = re.search(r"Submitted batch job (\d+)", job.stdout)
    assert found, (job.stdout, job.stderr)
    deadline = time.monotonic() + 120
    while len(list(out.glob("rank*.ndcap"))) < 2:  # the ranks train
        assert time.monotonic() < deadline, (log_path.read_text() if log_path.exists() else "")
        time.sleep(0.5)
    return found.group(1), out, log_path


def interrupted(out: Path, log_path: Path) -> dict:
    """The report of a job Slurm interrupted: "interrupted", no error found (never a crash or a
    hang of the ranks)."""
    report = json.loads((out / "report.json").read_text())
    log = log_path.read_text() if log_path.exists() else ""
    assert report["verdict"] == "interrupted", (report["verdict"], log[-3000:])
    assert not [f for f in report["findings"] if f["severity"] == "error"], report["findings"]
    return report


def test_the_time_limit_reads_interrupted_by_slurm_not_a_failure(slurm, tmp_path):
    """A healthy job that outlives its one-minute --time: Slurm ends it. The report reads
    "interrupted", by Slurm's time limit - never a crash or a hang of the ranks."""
    job_id, out, log_path = training(slurm, tmp_path, 100000, "--time=1")
    record = finished(slurm, job_id, 300)
    assert record.get("JobState") == "TIMEOUT", record
    report = interrupted(out, log_path)
    assert re.match(r"interrupted by SIGTERM from Slurm: its time limit \(00:01:00, ending ",
                    report["notes"][0]), report["notes"][0]
    no_job_left(slurm)


def test_scancel_signal_reads_interrupted_by_slurm_with_the_sender(slurm, tmp_path):
    """`scancel --full --signal=TERM` to a running healthy job: slurmstepd delivers it to the
    batch script's processes. The report reads "interrupted", from Slurm's slurmstepd."""
    job_id, out, log_path = training(slurm, tmp_path, 100000)
    time.sleep(3)
    slurm.run(["scancel", "--full", "--signal=TERM", job_id], timeout=60)
    finished(slurm, job_id, 180)
    report = json.loads((out / "report.json").read_text())
    log = log_path.read_text() if log_path.exists() else ""
    assert report["verdict"] == "interrupted", (report["verdict"], log[-3000:])
    assert report["notes"][0].startswith("interrupted by SIGTERM from Slurm"), report["notes"][0]
    assert not [f for f in report["findings"] if f["severity"] == "error"], report["findings"]
    no_job_left(slurm)


def test_a_requeued_job_keeps_its_first_launch_as_an_attempt(slurm, tmp_path):
    """`sbatch --requeue`, then `scontrol requeue` while it trains: the batch script runs again
    (SLURM_RESTART_COUNT 1) with the same --out. The final report lists both launches, the
    first one interrupted by the requeue, the second run to its end."""
    job_id, out, log_path = training(slurm, tmp_path, 300, "--requeue", "--open-mode=append")
    time.sleep(3)
    slurm.run(["scontrol", "requeue", job_id], timeout=60)
    record = finished(slurm, job_id, 400)
    log = log_path.read_text() if log_path.exists() else ""
    assert record.get("Restarts") == "1", (record, log[-3000:])
    report = json.loads((out / "report.json").read_text())
    first, second = report["attempts"]
    assert (first["requeue"], second["requeue"]) == (0, 1), report["attempts"]
    assert first["verdict"] in ("interrupted", "crash") and second["verdict"] == "ok", \
        (report["attempts"], log[-3000:])
    assert report["verdict"] == "ok"
    again = replayed(out)  # offline, the same: the first launch's interrupt is its own
    assert again["verdict"] == "ok" and again["attempts"] == report["attempts"]
    no_job_left(slurm)



def test_a_signal_to_the_steps_before_the_time_limit_reads_interrupted(slurm, tmp_path):
    """`sbatch --signal=TERM@90 --time=3`: Slurm signals the job's steps - the ranks - and not
    the batch script, 30 to 90 s in (it may signal up to a minute early); srun ends with 143.
    The doctor sent nothing and got nothing: it reads the end as the interrupt it was, by
    Slurm's time limit."""
    job_id, out, log_path = training(slurm, tmp_path, 100000, "--time=3", "--signal=TERM@90")
    finished(slurm, job_id, 300)
    report = interrupted(out, log_path)
    assert re.match(r"interrupted by SIGTERM from Slurm: its time limit \(00:03:00, ending .*"
                    r"sent to the job's processes, not to nccl-doctor: srun ended with status "
                    r"143", report["notes"][0]), report["notes"][0]
    assert {r["state"] for r in report["ranks"]} == {"stopped"}, report["ranks"]
    assert replayed(out)["verdict"] == "interrupted"
    no_job_left(slurm)


def test_a_signal_to_the_batch_script_reaches_the_doctor_it_execs(slurm, tmp_path):
    """`sbatch --signal=B:TERM@90 --time=3`: the batch script alone is signalled; the docs'
    script `exec`s the doctor, which gets it, names the sender and passes it on."""
    job_id, out, log_path = training(slurm, tmp_path, 100000, "--time=3",
                                     "--signal=B:TERM@90")
    finished(slurm, job_id, 300)
    report = interrupted(out, log_path)
    assert re.match(r"interrupted by SIGTERM from Slurm: its time limit \(00:03:00, ",
                    report["notes"][0]), report["notes"][0]
    assert "slurmstepd" in report["notes"][0], report["notes"][0]
    no_job_left(slurm)
