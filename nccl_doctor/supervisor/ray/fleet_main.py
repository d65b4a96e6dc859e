"""The node doctors' keeper (``python -m nccl_doctor.supervisor.ray.fleet_main``), a process of
its own that the supervisor of a ``--ray`` run starts: it joins the Ray cluster as a driver of
its own (namespace ``nccl-doctor``), puts one node doctor on every alive node but the
supervisor's, pinned there with node-affinity scheduling, and follows the nodes that join.

A node doctor is an actor (``NodeDoctor``, no CPU reserved) that runs ``nccl-doctor run`` on its
node as a follower of the supervisor's coordinator, around ``node_ranks`` (the node's ranks as a
job). Its lines on stdout, one JSON object each, tell the supervisor what happened:
``{"expect": N}`` how many node doctors there are or are starting (each pass over the nodes),
``{"node": HOST, "node_rank": K, "node_id": ID}`` when a doctor started there,
``{"error": TEXT}`` when the cluster cannot be reached. Standard input's end (the supervisor's job
ended, or the supervisor is gone) ends every doctor's node job; the doctors' supervisors then
take the leader's final report and exit, and this process leaves the cluster, which ends its
actors (they are its own, never detached: the doctor keeps no Ray process alive after its job).
"""

from __future__ import annotations

import argparse
import json
import os
import select
import sys
import time
from typing import Any

#: How often the cluster's nodes are listed (nodes that joined get a doctor).
EVERY = 2.0


def say(record: dict[str, Any]) -> None:
    sys.stdout.write(json.dumps(record) + "\n")
    sys.stdout.flush()


class NodeDoctor:
    """One node's doctor: ``nccl-doctor run`` as a follower, around the node's ranks."""

    def __init__(self) -> None:
        self.proc: Any = None
        self.end_file = ""

    def host(self) -> str:
        from nccl_doctor import env

        return env.host_name()

    def start(self, argv: list[str], out: str, job: str) -> dict[str, Any]:
        import subprocess
        import tempfile

        from nccl_doctor import env

        self.end_file = os.path.join(tempfile.mkdtemp(prefix="nccl-doctor-ray-"), "end")
        child = {k: v for k, v in os.environ.items()
                 if k not in (env.RAY_RUNTIME_ENV_HOOK, env.CAPTURE_DIR)}
        child[env.COORDINATOR_JOB] = job
        command = [sys.executable, "-m", "nccl_doctor", "run", "--out", out, *argv, "--",
                   sys.executable, "-m", "nccl_doctor.supervisor.node_ranks",
                   self.end_file, str(os.getpid())]
        self.proc = subprocess.Popen(command, env=child, stdin=subprocess.DEVNULL)
        return {"pid": self.proc.pid}

    def poll(self) -> int | None:
        """The doctor's exit status if it ended (before the job did: it was refused)."""
        return self.proc.poll() if self.proc is not None else None

    def end(self, wait: float) -> tuple[int | None, bool]:
        """The job ended: end the node's job, wait for its supervisor (its report); its exit
        status, and whether it had ended before (refused: its directory held, ...)."""
        if self.proc is None:
            return None, False
        early = self.proc.poll()
        if early is not None:
            return early, True
        try:
            with open(self.end_file, "w"):
                pass
        except OSError:
            self.proc.terminate()
        try:
            return self.proc.wait(wait), False
        except Exception:  # noqa: BLE001 - out of time: stopped, never left behind
            self.proc.kill()
            return self.proc.wait(), False
        finally:
            import shutil

            shutil.rmtree(os.path.dirname(self.end_file), ignore_errors=True)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="nccl_doctor.supervisor.ray.fleet_main")
    p.add_argument("--address", required=True)
    p.add_argument("--leader-host", required=True)
    p.add_argument("--out", required=True, help="the supervisor's capture directory")
    p.add_argument("--port", type=int, required=True, help="the coordinator's port")
    p.add_argument("--wait", type=float, default=300.0, help="for the doctors' reports")
    p.add_argument("follower", nargs=argparse.REMAINDER, help="options of each doctor's run")
    args = p.parse_args(argv)
    follower = args.follower[1:] if args.follower[:1] == ["--"] else args.follower
    from nccl_doctor import env
    from nccl_doctor.supervisor.cluster import early_end

    os.environ.pop(env.RAY_RUNTIME_ENV_HOOK, None)  # this driver's workers are not the job's
    job = os.environ.get(env.COORDINATOR_JOB, "")
    try:
        import ray
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        ray.init(address=args.address, namespace="nccl-doctor", log_to_driver=False,
                 logging_level="ERROR", configure_logging=False)
        ip = ray.util.get_node_ip_address()
    except Exception as err:  # noqa: BLE001 - said, and the leader goes on alone
        say({"error": f"cannot reach the Ray cluster at {args.address}: {err}"})
        return 1
    from pathlib import Path

    from nccl_doctor.capture.names import node_dir

    actor = ray.remote(num_cpus=0, max_restarts=0)(NodeDoctor)
    # the job's federation key reaches each node doctor through Ray, never a command line
    key = os.environ.get(env.FEDERATION_KEY)
    doctors_env = {"env_vars": {env.FEDERATION_KEY: key}} if key else None
    doctors: dict[str, Any] = {}  # Ray node id -> its doctor (None: the leader's, or failed)
    names: dict[str, str] = {}  # Ray node id -> its host
    ended: set[str] = set()  # node doctors that ended before the job
    while True:
        try:
            nodes = [n for n in ray.nodes() if n.get("Alive") and n["NodeID"] not in doctors]
        except Exception:  # noqa: BLE001 - the cluster is going: keep what runs
            nodes = []
        # the new nodes' hosts first (the leader waits for every node doctor it is told of)
        handles, hosts = {}, {}
        for node in nodes:
            node_id = node["NodeID"]
            doctors[node_id] = None
            handles[node_id] = actor.options(scheduling_strategy=NodeAffinitySchedulingStrategy(
                node_id, soft=False), runtime_env=doctors_env).remote()
        for node_id, handle in handles.items():
            try:  # the host as the node names itself (NCCL_DOCTOR_HOSTNAME, else its own)
                hosts[node_id] = ray.get(handle.host.remote(), timeout=60)
            except Exception as err:  # noqa: BLE001 - that node goes undoctored, said
                say({"error": f"no node doctor on node {node_id[:8]}: {err}"})
        for node_id, host in list(hosts.items()):
            if host == args.leader_host:  # the supervisor's own node: it reads it itself
                ray.kill(handles[node_id])
                del hosts[node_id]
        started = sum(1 for h in doctors.values() if h is not None)
        # the node doctors the leader waits for (one that fails below is said; the leader then
        # waits its join window for it)
        say({"expect": started + len(hosts)})
        for node_id, host in hosts.items():
            rank = 1 + sum(1 for h in doctors.values() if h is not None)
            options = [*follower, "--coordinator", f"{ip}:{args.port}", "--node-rank", str(rank)]
            try:
                info = ray.get(handles[node_id].start.remote(
                    options, str(node_dir(Path(args.out), host)), job), timeout=60)
            except Exception as err:  # noqa: BLE001
                say({"error": f"no node doctor on {host}: {err}"})
                continue
            doctors[node_id] = handles[node_id]
            names[node_id] = host
            say({"node": host, "node_rank": rank, "node_id": node_id, **info})
        for node_id in [n for n, h in doctors.items() if h is not None and n not in ended]:
            try:  # a doctor that ended before the job: refused (its directory held, ...)
                status = ray.get(doctors[node_id].poll.remote(), timeout=10)
            except Exception:  # noqa: BLE001 - lost with its node: the leader says so
                continue
            if status is not None:
                ended.add(node_id)
                say({"error": early_end(names[node_id], status), "gone": names[node_id]})
        if select.select([sys.stdin], [], [], EVERY)[0] and not sys.stdin.readline():
            break  # the supervisor's job ended (or the supervisor is gone)
    ends = {names[n]: h.end.remote(args.wait) for n, h in doctors.items()
            if h is not None and n not in ended}
    deadline = time.time() + args.wait + 10
    while ends:  # each doctor's end said as it comes (the leader waits for those still on)
        done, _ = ray.wait(list(ends.values()), num_returns=1,
                           timeout=max(1.0, deadline - time.time()))
        for host in [h for h, ref in ends.items() if not done or ref in done]:
            try:
                status, early = ray.get(ends.pop(host), timeout=1.0)
            except Exception:  # noqa: BLE001 - a doctor lost with its node, or out of time
                status, early = None, False
            if early and status:  # it ended before the job, unseen by the loop above
                say({"error": early_end(host, status), "gone": host})
            else:
                say({"gone": host})
    ray.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
