"""The supervisor's side of a run inside a Slurm allocation (``nccl-doctor run -- srun ...``):
before the job starts, it launches the node doctors' step through Slurm (``srun --overlap``, one
task per node of the allocation: ``node_main``), reads what each says (its stdout, which srun
gathers), raises the number of nodes the leader waits for, and ends them once the job ended (the
step's standard input closes: ``--input=all`` hands that end to every task). Stopping the job for
a hang cancels the job's own steps through Slurm (``scancel``), on every node."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil

from nccl_doctor import env
from nccl_doctor.supervisor.cluster import Said, hang_up, tell
from nccl_doctor.supervisor.slurm import allocation as alloc

#: The node doctors' step, as ``squeue`` and ``sacct`` list it.
STEP_NAME = "nccl-doctor"
#: How long the job's start waits for the node doctors to be up (their directories claimed);
#: a node doctor waits as long for its own.
READY_WITHIN = 60.0


@dataclass(frozen=True)
class SlurmRun:
    """Where the run's node doctors go and how they run."""

    allocation: alloc.Allocation
    port: int  # the coordinator's, on this host
    follower_args: tuple[str, ...]  # the options of each node doctor's `nccl-doctor run`
    leader_host: str

    @property
    def job(self) -> str:
        """What both sides of the coordinator check they serve."""
        return f"slurm:{self.allocation.job_id}:{self.port}"

    @property
    def leader_inside(self) -> bool:
        """Whether this supervisor runs on a node of the allocation (an sbatch script; salloc's
        shell runs where salloc was typed)."""
        return self.leader_host in self.allocation.nodes

    @property
    def followers(self) -> int:
        return len(self.allocation.nodes) - (1 if self.leader_inside else 0)


class SlurmFleet:
    """The node doctors of one run, as the supervisor sees them (a ``Cluster``)."""

    def __init__(self, run: SlurmRun, out: Path, key: bytes | None) -> None:
        self.run, self.out, self.key = run, out, key
        self.proc: subprocess.Popen | None = None
        self._said = Said()
        self._ready: set[str] = set()  # hosts whose doctor is up, skipped, or failed
        self._cancelled = False
        self._job_pid: int | None = None

    # -- before the job: the node doctors' step --------------------------------------------
    def command(self) -> list[str]:
        run = self.run
        return ["srun", "--overlap", f"--jobid={run.allocation.job_id}",
                f"--nodes={len(run.allocation.nodes)}", "--ntasks-per-node=1",
                f"--job-name={STEP_NAME}", "--input=all", "--kill-on-bad-exit=0", "--wait=0",
                "--cpu-bind=none", sys.executable, "-m", "nccl_doctor.supervisor.slurm.node_main",
                "--leader-host", run.leader_host, "--port", str(run.port),
                "--out", str(self.out.absolute()),
                "--node-offset", "0" if run.leader_inside else "1", "--",
                *run.follower_args]

    def environment(self) -> dict[str, str]:
        """The step's: this process's own (no recorder: the doctors are not the job's), the
        coordinator's job and the job's key, which Slurm hands every task."""
        out = {k: v for k, v in os.environ.items()
               if k not in (env.CAPTURE_DIR, env.LEADER_HOST, env.FEDERATION_KEY_FILE)}
        out[env.COORDINATOR_JOB] = self.run.job
        if self.key is not None:
            out[env.FEDERATION_KEY] = self.key.decode()
        # a step inside an sbatch script inherits the script's SLURM_* (its task counts
        # among them), which would shape this step: srun's own options decide
        for name in ("SLURM_NTASKS", "SLURM_NPROCS", "SLURM_NTASKS_PER_NODE", "SLURM_CPUS_PER_TASK",
                     "SLURM_MEM_PER_CPU", "SLURM_MEM_PER_NODE", "SLURM_DISTRIBUTION"):
            out.pop(name, None)
        return out

    def prepare(self, supervisor: Any) -> None:
        """Start the node doctors and wait (up to ``READY_WITHIN`` s) until each is up: a
        doctor's directory must be its own before the ranks there write into it."""
        if self.run.followers == 0:
            return
        try:
            self.proc = subprocess.Popen(self.command(), env=self.environment(),
                                         stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                         stderr=subprocess.DEVNULL, text=True,
                                         start_new_session=True)
        except OSError as err:
            supervisor.live.announce(f"Slurm: cannot start the node doctors ({err.strerror}); "
                                     "diagnosing this node alone")
            return
        self._said.follow(self.proc, "nccl-doctor-slurm")
        deadline = time.monotonic() + READY_WITHIN
        while (len(self._ready) < len(self.run.allocation.nodes) and self.proc.poll() is None
               and time.monotonic() < deadline):
            self(supervisor)
            time.sleep(0.05)
        self(supervisor)
        if len(self._ready) < len(self.run.allocation.nodes):
            waiting = sorted(set(self.run.allocation.nodes) - self._ready)
            supervisor.live.announce(
                f"Slurm: the node doctor{'s' if len(waiting) > 1 else ''} on "
                f"{', '.join(waiting)} not up after {READY_WITHIN:.0f} s; the job starts now")

    # -- while the job runs ------------------------------------------------------------------
    def start(self, supervisor: Any) -> None:
        self._job_pid = supervisor.job.pid if supervisor.job is not None else None

    def __call__(self, supervisor: Any) -> None:
        """Each tick: what the node doctors said since, announced; who the leader waits for."""
        for said in self._said.taken():
            host = str(said.get("host", ""))
            if host:
                self._ready.add(host)
            tell(said, supervisor, "Slurm")

    def stopping(self, sig: int) -> None:
        """The job is stopped (a hang, ``--on-hang kill``): its steps, on every node, through
        Slurm; the job's own srun is signalled by the supervisor as well."""
        if self._cancelled or self._job_pid is None:
            return
        self._cancelled = True
        try:
            mine = alloc.launched_by(self.run.allocation.job_id, _tree(self._job_pid),
                                     self._hosts())
            alloc.scancel([s.id for s in mine if s.name != STEP_NAME])
        except alloc.SlurmError:
            pass  # the signals to srun still stop the step (srun forwards them to its tasks)

    def _hosts(self) -> set[str]:
        """This host's names as a step's SrunHost may hold them."""
        name = socket.gethostname()  # (Slurm may record the short name)
        return {name, name.split(".")[0], self.run.leader_host}

    # -- after the job -----------------------------------------------------------------------
    def end(self) -> None:
        """The job ended: every node doctor ends its node's part (its standard input ends)."""
        hang_up(self.proc)

    def close(self, wait: float) -> None:
        """Wait (up to ``wait`` s) for the node doctors' step to end; then stop it (Slurm first:
        its tasks on every node)."""
        if self.proc is None:
            return
        self.end()
        try:
            self.proc.wait(wait)
            return
        except subprocess.TimeoutExpired:
            pass
        try:
            alloc.scancel([s.id for s in alloc.launched_by(self.run.allocation.job_id,
                                                            [self.proc.pid], self._hosts())])
        except alloc.SlurmError:
            pass
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()


def _tree(pid: int) -> set[int]:
    """``pid`` and its descendants (the job's sruns among them)."""
    try:
        root = psutil.Process(pid)
        return {pid, *(p.pid for p in root.children(recursive=True))}
    except psutil.Error:
        return {pid}


def leader_rendezvous(run: SlurmRun):
    """Where this supervisor, the leader, hosts the coordinator for the node doctors."""
    from nccl_doctor.supervisor.federation.rendezvous import Rendezvous

    return Rendezvous("127.0.0.1", run.port, 1 + run.followers, 0, "Slurm allocation "
                      f"{run.allocation.job_id}", run.job)
