"""The supervisor's side of a ``--ray`` run: it starts the node doctors' keeper
(``fleet_main``, a process of its own: Ray's threads and signals stay out of the supervisor),
reads what it says and hands it on - each doctor that started raises the number of nodes the
leader waits for; each error is announced - and ends the doctors' node jobs once the driver's
job ended."""

from __future__ import annotations

import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from nccl_doctor import env
from nccl_doctor.supervisor.cluster import Said, hang_up, tell


@dataclass(frozen=True)
class RayCluster:
    """Where the job's Ray cluster is and how its node doctors run."""

    address: str  # Ray's: "auto", "HOST:PORT"
    port: int  # the coordinator's, on this host
    follower_args: tuple[str, ...]  # the options of each node doctor's `nccl-doctor run`

    @property
    def job(self) -> str:
        """What both sides of the coordinator check they serve (no launcher names it)."""
        return f"ray:{self.address}:{self.port}"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("", 0))
        return int(s.getsockname()[1])


def job_environment(environ: dict[str, str], leader_host: str) -> dict[str, str]:
    """The driver's environment: Ray's runtime-env hook set to the doctor's (a user's own is
    kept and called first)."""
    out = dict(environ)
    theirs = out.get(env.RAY_RUNTIME_ENV_HOOK)
    if theirs and theirs != RUNTIME_ENV_HOOK:
        out[env.RAY_USER_HOOK] = theirs
    out[env.RAY_RUNTIME_ENV_HOOK] = RUNTIME_ENV_HOOK
    out[env.LEADER_HOST] = leader_host
    return out


RUNTIME_ENV_HOOK = "nccl_doctor.rank.ray_env.runtime_env_hook"


class RayFleet:
    """The node doctors of one run, as the supervisor sees them (a listener: called every
    tick, it says what the keeper said and raises the nodes the leader waits for)."""

    def __init__(self, cluster: RayCluster, out: Path, leader_host: str,
                 environ: dict[str, str], key: bytes | None = None) -> None:
        """``key``: the job's federation key, handed to the node doctors through Ray (the
        actors' runtime_env)."""
        self.cluster, self.out, self.leader_host, self.key = cluster, out, leader_host, key
        self.environ = environ
        self.proc: subprocess.Popen | None = None
        self._said = Said()
        self.surveyed = False  # the keeper said which nodes get a doctor (or could not)
        self._supervisor: Any = None

    def prepare(self, supervisor: Any) -> None:
        """(Ray's node doctors start with the job: its workers come later, from its driver.)"""

    def stopping(self, sig: int) -> None:
        """(Each node doctor stops its node's workers: the leader's decision reaches them.)"""

    def start(self, supervisor: Any) -> None:
        """Start the keeper (``supervisor``: whose federation waits for the node doctors)."""
        self._supervisor = supervisor
        command = [sys.executable, "-m", "nccl_doctor.supervisor.ray.fleet_main",
                   "--address", self.cluster.address, "--leader-host", self.leader_host,
                   "--out", str(self.out.absolute()), "--port", str(self.cluster.port), "--",
                   *self.cluster.follower_args]
        child = {k: v for k, v in self.environ.items() if k != env.RAY_RUNTIME_ENV_HOOK}
        child[env.COORDINATOR_JOB] = self.cluster.job
        if self.key is not None:
            child[env.FEDERATION_KEY] = self.key.decode()
        try:
            self.proc = subprocess.Popen(command, env=child, stdin=subprocess.PIPE,
                                         stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                                         text=True, start_new_session=True)
        except OSError as err:
            self._said.put({"error": f"cannot start the node doctors ({err.strerror})"})
            return
        self._said.follow(self.proc, "nccl-doctor-ray")

    def __call__(self, supervisor: Any) -> None:
        """Each tick: what the keeper said since, announced; the leader's count of nodes."""
        for said in self._said.taken():
            if "expect" in said and "error" not in said:
                self.surveyed = True
                leader = supervisor.federation.leader if supervisor.federation else None
                if leader is not None:  # the leader waits for these nodes too
                    leader.expect(1 + int(said["expect"]))
            tell(said, supervisor, "Ray")

    def end(self, survey_within: float = 60.0) -> None:
        """The driver's job ended: every node doctor ends its node's job (then reports). A job
        shorter than the keeper's start-up first waits (up to ``survey_within`` s) for it to say
        which nodes get a doctor, so that the leader waits for their reports (a keeper that
        could not reach the cluster has said so and exited)."""
        deadline = time.monotonic() + survey_within
        while (self.proc is not None and not self.surveyed and self.proc.poll() is None
               and self._supervisor is not None and time.monotonic() < deadline):
            self(self._supervisor)
            time.sleep(0.1)
        if self._supervisor is not None:
            self(self._supervisor)
        hang_up(self.proc)

    def close(self, wait: float) -> None:
        """Wait (up to ``wait`` s) for the keeper to leave the cluster; stop it after that."""
        if self.proc is None:
            return
        hang_up(self.proc)
        try:
            self.proc.wait(wait)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


def leader_rendezvous(cluster: RayCluster):
    """Where this supervisor, the leader, hosts the coordinator for the node doctors."""
    from nccl_doctor.supervisor.federation.rendezvous import Rendezvous

    return Rendezvous("127.0.0.1", cluster.port, 0, 0, "--ray", cluster.job)  # nodes: as found
