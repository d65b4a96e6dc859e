"""The Slurm test harness itself (slurm_cluster.py): a real 2-node Slurm 22.05 cluster on this
machine - slurmctld, a slurmd in each of two UTS namespaces (nodeA, nodeB), a munged of its own -
that srun, sbatch, salloc, scancel and scontrol drive as on a real cluster: tasks and batch
scripts on their node's host, overlapping steps, a cancelled step's tasks gone from both nodes,
the launching srun's host and pid on its step, a node's death."""

from __future__ import annotations

import re
import subprocess
import time
from contextlib import contextmanager

import psutil
import pytest

from slurm_cluster import SlurmCluster

pytestmark = pytest.mark.upstream  # one worker runs them (tests/conftest.py SHARED)


@pytest.fixture(scope="module")
def slurm(tmp_path_factory):
    t0 = time.monotonic()
    cluster = SlurmCluster.up(lambda: tmp_path_factory.mktemp("slurm"))
    try:
        print(f"Slurm cluster of 2 nodes up in {time.monotonic() - t0:.2f} s")
        yield cluster
    finally:
        cluster.stop()
    assert not cluster.leftovers(), cluster.leftovers()


def ok(proc: subprocess.CompletedProcess) -> str:
    assert proc.returncode == 0, (proc.args, proc.returncode, proc.stdout, proc.stderr)
    return proc.stdout


@contextmanager
def allocation(slurm: SlurmCluster, nodes: int = 2):
    """A job allocation of ``nodes`` nodes and no step (``salloc --no-shell``); its id.
    Cancelled at the end."""
    proc = slurm.run(["salloc", f"-N{nodes}", "--no-shell"], timeout=60)
    found = re.search(r"Granted job allocation (\d+)", proc.stderr)
    assert proc.returncode == 0 and found, (proc.stdout, proc.stderr)
    job = found.group(1)
    try:
        yield job
    finally:
        slurm.run(["scancel", job])


def tasks(slurm: SlurmCluster, host: str, marker: str) -> list[psutil.Process]:
    """``host``'s processes whose command line holds ``marker``, srun left out: a step's tasks
    (and its slurmstepd, ``slurmstepd: [JOB.STEP]``)."""
    found = []
    for p in slurm.node_processes(host):
        try:
            if marker in " ".join(p.cmdline()) and p.name() != "srun":
                found.append(p)
        except psutil.Error:
            continue
    return found


def wait_for(what: str, ready, timeout: float = 30, proc: subprocess.Popen | None = None):
    deadline = time.monotonic() + timeout
    while not (value := ready()):
        assert time.monotonic() < deadline, f"{what}: not in {timeout} s"
        assert proc is None or proc.poll() is None, \
            f"{what}: the srun ended ({proc.returncode}): {proc.communicate()}"
        time.sleep(0.1)
    return value


def step(slurm: SlurmCluster, step_id: str) -> dict[str, str] | None:
    return next((s for s in slurm.show("step") if s.get("StepId") == step_id), None)


def test_srun_runs_each_task_on_its_node(slurm):
    t0 = time.monotonic()
    out = ok(slurm.run(["srun", "-N2", "--ntasks-per-node=1", "hostname"]))
    print(f"srun -N2 hostname: {time.monotonic() - t0:.3f} s")
    assert sorted(out.split()) == ["nodeA", "nodeB"]

    out = ok(slurm.run(["srun", "-N2", "--ntasks-per-node=2", "sh", "-c",
                        'echo $SLURM_PROCID $SLURMD_NODENAME $SLURM_NODEID $(hostname) '
                        '$SLURM_STEP_ID $SLURM_JOB_NODELIST $SLURM_LAUNCH_NODE_IPADDR']))
    rows = sorted(tuple(line.split()) for line in out.splitlines())
    assert [r[:4] for r in rows] == [("0", "nodeA", "0", "nodeA"), ("1", "nodeA", "0", "nodeA"),
                                    ("2", "nodeB", "1", "nodeB"), ("3", "nodeB", "1", "nodeB")]
    assert {r[4:] for r in rows} == {("0", "nodeA,nodeB", "127.0.0.1")}


def test_a_batch_script_runs_on_the_first_node_and_its_srun_on_both(slurm, tmp_path):
    script = tmp_path / "job.sh"
    script.write_text(f"""#!/bin/sh
echo "batch on $(hostname) job $SLURM_JOB_ID nodes $SLURM_JOB_NODELIST" > {tmp_path}/batch.txt
srun --ntasks-per-node=1 sh -c 'echo "$SLURM_PROCID $(hostname)"' > {tmp_path}/steps.txt
""")
    script.chmod(0o755)
    proc = slurm.run(["sbatch", "--wait", "-N2", f"--output={tmp_path}/slurm-%j.out",
                      str(script)], timeout=120)
    ok(proc)
    job = re.search(r"Submitted batch job (\d+)", proc.stdout).group(1)
    assert (tmp_path / "batch.txt").read_text() == f"batch on nodeA job {job} nodes nodeA,nodeB\n"
    assert sorted((tmp_path / "steps.txt").read_text().splitlines()) == ["0 nodeA", "1 nodeB"]
    assert (tmp_path / f"slurm-{job}.out").read_text() == ""


def test_an_overlapping_step_runs_beside_a_long_one(slurm):
    with allocation(slurm) as job:
        long = slurm.on("nodeA", ["srun", f"--jobid={job}", "-N2", "--ntasks-per-node=1",
                                  "sleep", "301"], stdout=subprocess.PIPE,
                        stderr=subprocess.PIPE, text=True)
        try:
            wait_for("step 0's tasks on both nodes",
                     lambda: all(tasks(slurm, h, "sleep 301") for h in slurm.hosts), proc=long)
            t0 = time.monotonic()
            proc = slurm.run(["srun", f"--jobid={job}", "--overlap", "-N2",
                              "--ntasks-per-node=1", "sh", "-c",
                              'echo $SLURM_STEP_ID $(hostname)'], timeout=60)
            assert sorted(ok(proc).splitlines()) == ["1 nodeA", "1 nodeB"]
            assert time.monotonic() - t0 < 30
            assert long.poll() is None  # the long step still runs
            assert step(slurm, f"{job}.0")["State"] == "RUNNING"
        finally:
            long.kill()
            long.communicate()


def test_scancel_of_a_step_kills_its_tasks_on_both_nodes(slurm):
    with allocation(slurm) as job:
        # each task a shell and its child: the whole tree goes (proctrack/linuxproc; "&&": a
        # shell whose sleep was killed first never says done, whichever is signalled first)
        run = slurm.on("nodeA", ["srun", f"--jobid={job}", "-N2", "--ntasks-per-node=1",
                                 "sh", "-c", "sleep 302 && echo done"],
                       stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        wait_for("the step's tasks on both nodes",
                 lambda: all(len(tasks(slurm, h, "sleep 302")) == 2 for h in slurm.hosts),
                 proc=run)
        assert step(slurm, f"{job}.0")["State"] == "RUNNING"
        ok(slurm.run(["scancel", f"{job}.0"]))
        out, err = run.communicate(timeout=60)
        assert run.returncode != 0 and "done" not in out, (run.returncode, out, err)
        assert f"STEP {job}.0 ON nodeA CANCELLED" in err, err
        wait_for("no task left", lambda: not any(tasks(slurm, h, "sleep 302")
                                                 or tasks(slurm, h, f"[{job}.0]")
                                                 for h in slurm.hosts))
        assert step(slurm, f"{job}.0") is None
        # the allocation itself goes on
        assert ok(slurm.run(["squeue", "-h", "-j", job, "-o", "%T"])).strip() == "RUNNING"


def test_a_steps_srun_host_and_pid(slurm):
    with allocation(slurm) as job:
        runs = {host: slurm.on(host, ["srun", f"--jobid={job}", "--overlap", "-N2",
                                      "--ntasks-per-node=1", "sleep", "303"],
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
                for host in slurm.hosts}
        try:
            def both():
                steps = [s for s in slurm.show("step") if s["StepId"].startswith(f"{job}.")]
                return steps if len(steps) == 2 else None

            steps = wait_for("both steps", both)
            srun_of = {s["SrunHost:Pid"]: s for s in steps}
            assert sorted(srun_of) == sorted(f"{h}:{p.pid}" for h, p in runs.items()), srun_of
            for host, proc in runs.items():  # the pid is that srun's, on that host
                assert psutil.Process(proc.pid).cmdline()[0] == "srun"
                assert proc.pid in [p.pid for p in slurm.node_processes(host)]
        finally:
            for proc in runs.values():
                proc.kill()
                proc.wait()


def test_a_killed_node_is_marked_down_and_its_step_fails(slurm):
    """kill_node: every process of nodeB at once; the controller marks it down after
    SlurmdTimeout, the step and job fail with a node failure. It comes back (start_node)."""
    with allocation(slurm) as job:
        run = slurm.on("nodeA", ["srun", f"--jobid={job}", "-N2", "--ntasks-per-node=1",
                                 "sleep", "304"], stdout=subprocess.PIPE,
                       stderr=subprocess.PIPE, text=True)
        wait_for("the step's tasks on both nodes",
                 lambda: all(tasks(slurm, h, "sleep 304") for h in slurm.hosts), proc=run)
        t0 = time.monotonic()
        killed = slurm.kill_node("nodeB")
        assert len(killed) >= 3  # slurmd, slurmstepd, the task
        assert slurm.node_processes("nodeB") == []
        _, err = run.communicate(timeout=90)
        print(f"nodeB killed: srun ended after {time.monotonic() - t0:.1f} s")
        assert "Node failure on nodeB" in err, err
        assert slurm.states()["nodeB"].startswith("down")
        assert not tasks(slurm, "nodeA", "sleep 304")
    slurm.start_node("nodeB")
    slurm.wait_up(60)
    assert sorted(ok(slurm.run(["srun", "-N2", "hostname"])).split()) == ["nodeA", "nodeB"]
