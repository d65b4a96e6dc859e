"""A real Slurm cluster of two nodes on this machine, private to one test session: Debian's Slurm
22.05 daemons (``slurmctld``, two ``slurmd``) and a ``munged`` of its own, everything they write
(configuration, munge key and socket, state, spool, logs, pid files) under one directory.

Each ``slurmd`` runs in a UTS namespace of its own whose hostname is its node's name (nodeA,
nodeB), as the multi-node tests simulate hosts (reproducers/nodes.py, test_ray_cluster.py): it
and everything it starts (``slurmstepd``, the tasks of job steps, batch scripts) see that
hostname. The controller runs in a namespace named after the cluster. Both nodes listen on
127.0.0.1, each on a port of its own; every port is picked free at start.

    cluster = SlurmCluster(tmp)          # starts munged, slurmctld, the slurmds
    cluster.wait_up()                    # until sinfo shows both nodes idle
    subprocess.run(["srun", "-N2", "hostname"], env=cluster.env())
    cluster.on("nodeA", ["srun", ...])   # srun launched from nodeA (its SrunHost)
    cluster.kill_node("nodeB")           # nodeB dies: every process of it, SIGKILL
    cluster.stop()                       # nothing of it left running

Needs root (SlurmUser=root, ``unshare -u``); where a binary is missing or namespaces are
refused, the constructor raises ``SlurmUnavailable`` saying what (``make tools`` installs the
Debian packages).
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import time
from pathlib import Path
from typing import Callable, Iterable, Sequence

import psutil

from nccl_doctor.reproducers.nodes import free_port, namespaces_work

#: The commands the cluster needs -> the Debian package that has it (the Makefile's tools step).
BINARIES = {"munged": "munge", "slurmctld": "slurmctld", "slurmd": "slurmd",
            "slurmstepd": "slurmd", "srun": "slurm-client", "sinfo": "slurm-client",
            "scontrol": "slurm-client", "unshare": "util-linux", "nsenter": "util-linux"}

#: The environment variables of a Slurm job or of a user's defaults that would send the clients
#: elsewhere (a test session run inside a real Slurm job has SLURM_JOB_ID, ...): not passed on.
FOREIGN = ("SLURM_", "SALLOC_", "SBATCH_", "SRUN_", "SQUEUE_", "SINFO_", "SCANCEL_", "SCONTROL_")

#: Unix socket paths (munged's, slurmstepd's in the spool) must fit in 107 bytes.
MAX_ROOT = 64


class SlurmUnavailable(RuntimeError):
    """The cluster cannot run here: the one line says what is missing."""


def _which(name: str) -> str | None:
    """``name``'s path: on PATH, or in /usr/sbin, /sbin (a user's PATH on Debian lacks them)."""
    return shutil.which(name, path=os.pathsep.join(
        [os.environ.get("PATH", os.defpath), "/usr/sbin", "/sbin"]))


def _ns(pid: int) -> str | None:
    try:
        return os.readlink(f"/proc/{pid}/ns/uts")
    except OSError:
        return None


def _ancestors() -> set[int]:
    pids, p = set(), psutil.Process()
    while p is not None:
        pids.add(p.pid)
        p = p.parent()
    return pids


def _tail(path: Path, n: int = 1500) -> str:
    try:
        return f"--- {path.name}\n" + path.read_text(errors="replace")[-n:]
    except OSError:
        return f"--- {path.name}: none"


class SlurmCluster:
    """A private Slurm cluster under ``tmp``; the constructor starts it (``wait_up`` waits for
    it), ``stop`` ends it."""

    @classmethod
    def up(cls, make_dir: Callable[[], Path], attempts: int = 3) -> SlurmCluster:
        """A cluster whose daemons are up (``wait_up``). Its ports are picked free, then bound by
        the daemons: another process of the machine (a test's gloo connection, on an ephemeral
        port) may take one in between. A cluster that lost that race is stopped and started
        again, in a new directory on new ports; any other failure is raised at once."""
        for attempt in range(attempts):
            cluster = cls(make_dir())
            try:
                cluster.wait_up()
                return cluster
            except RuntimeError as err:
                cluster.stop()
                if "Address already in use" not in str(err) or attempt == attempts - 1:
                    raise
        raise AssertionError("unreachable")

    def __init__(self, tmp: Path, hosts: Sequence[str] = ("nodeA", "nodeB"), cpus: int = 8,
                 name: str = "ndslurm") -> None:
        self.root, self.hosts, self.cpus, self.name = Path(tmp).resolve(), tuple(hosts), cpus, name
        self.bin = {b: _which(b) for b in BINARIES}
        missing = [f"{b} (Debian package {p})" for b, p in BINARIES.items() if not self.bin[b]]
        if missing:
            raise SlurmUnavailable("Slurm cluster: missing " + ", ".join(missing) +
                                   "; `make tools` installs them (as root)")
        ok, why = namespaces_work()
        if not ok:
            raise SlurmUnavailable("Slurm cluster: UTS namespaces refused (`unshare -u true`: "
                                   f"{why or 'failed'}); it needs root")
        if len(str(self.root)) > MAX_ROOT:
            raise SlurmUnavailable(f"Slurm cluster: {self.root} is longer than {MAX_ROOT} "
                                   "characters (its unix sockets' paths would not fit)")
        self.conf = self.root / "etc" / "slurm.conf"
        self.logs = self.root / "log"
        self.munge_socket = self.root / "munge" / "munge.socket.2"
        self.ctld_port = free_port()
        self.ports = {h: free_port() for h in self.hosts}
        self._procs: dict[str, subprocess.Popen] = {}  # munged, slurmctld, slurmd-<host>
        self._ns: dict[str, str] = {}  # slurmctld / host -> its UTS namespace
        self._out: list = []
        self._killed: set[str] = set()  # nodes kill_node killed (and not started again)
        self.started = time.monotonic()
        try:
            self._write()
            self._start_munged()
            self._start_ctld()
            for host in self.hosts:
                self.start_node(host)
        except BaseException:
            self.stop()
            raise

    # -- set-up -------------------------------------------------------------------------------

    def _write(self) -> None:
        r = self.root
        for d in ("etc", "munge", "state", "log", "run", "spool"):
            (r / d).mkdir(parents=True, exist_ok=True)
        (r / "munge").chmod(0o755)
        (r / "spool").chmod(0o755)
        key = r / "munge" / "munge.key"
        key.unlink(missing_ok=True)
        if _which("mungekey"):
            subprocess.run([str(_which("mungekey")), "--create", "--keyfile", str(key)], check=True,
                           capture_output=True, timeout=30)
        else:
            key.write_bytes(os.urandom(128))
        key.chmod(0o600)
        (r / "etc" / "plugstack.conf").write_text("")  # none of /etc/slurm's SPANK plugins
        nodes = "\n".join(f"NodeName={h} NodeAddr=127.0.0.1 Port={self.ports[h]} "
                          f"CPUs={self.cpus} State=UNKNOWN" for h in self.hosts)
        self.conf.write_text(f"""\
# A private test cluster (tests/upstream/slurm_cluster.py); Slurm 22.05
ClusterName={self.name}
SlurmctldHost={self.name}(127.0.0.1)
SlurmctldPort={self.ctld_port}
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket={self.munge_socket}
StateSaveLocation={r}/state
SlurmdSpoolDir={r}/spool/%n
SlurmctldPidFile={r}/run/slurmctld.pid
SlurmdPidFile={r}/run/slurmd-%n.pid
SlurmctldLogFile={r}/log/slurmctld.log
SlurmdLogFile={r}/log/slurmd-%n.log
SlurmctldDebug=info
SlurmdDebug=info
PlugStackConfig={r}/etc/plugstack.conf
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SlurmdParameters=config_overrides
MpiDefault=none
ReturnToService=2
SlurmdTimeout=10
MessageTimeout=5
KillWait=2
InactiveLimit=0
MinJobAge=300
{nodes}
PartitionName=debug Nodes={",".join(self.hosts)} Default=YES MaxTime=INFINITE State=UP
""")

    def _log(self, name: str):
        f = open(self.logs / f"{name}.out", "ab")
        self._out.append(f)
        return f

    def _spawn(self, key: str, argv: list[str]) -> subprocess.Popen:
        out = self._log(key)
        proc = subprocess.Popen(argv, env=self.env(), stdin=subprocess.DEVNULL, stdout=out,
                                stderr=subprocess.STDOUT, cwd=self.root)
        self._procs[key] = proc
        return proc

    def _until(self, what: str, ready, proc: subprocess.Popen, log: Path,
               timeout: float = 30) -> None:
        deadline = time.monotonic() + timeout
        while not ready():
            if proc.poll() is not None or time.monotonic() > deadline:
                why = "exited" if proc.returncode is not None else f"not ready in {timeout} s"
                raise RuntimeError(f"Slurm cluster: {what} {why}\n{_tail(log)}")
            time.sleep(0.05)

    def _start_munged(self) -> None:
        m = self.root / "munge"
        proc = self._spawn("munged", [
            self.bin["munged"], "--foreground", "--force", f"--socket={self.munge_socket}",
            f"--key-file={m / 'munge.key'}", f"--pid-file={m / 'munged.pid'}",
            f"--log-file={self.logs / 'munged.log'}", f"--seed-file={m / 'munged.seed'}"])
        self._until("munged", self.munge_socket.exists, proc, self.logs / "munged.out")

    def _in_namespace(self, key: str, hostname: str, argv: list[str]) -> None:
        """``argv`` in a new UTS namespace named ``hostname`` (``unshare`` execs into it, so the
        Popen's pid is the daemon's); its namespace recorded once the hostname is set."""
        proc = self._spawn(key, [self.bin["unshare"], "-u", "sh", "-c",
                                 'hostname "$0" && exec "$@"', hostname, *argv])
        mine, name = _ns(os.getpid()), Path(argv[0]).name

        def named() -> bool:  # exec'd: past `hostname`, in its own namespace
            try:
                return psutil.Process(proc.pid).name() == name and _ns(proc.pid) != mine
            except psutil.Error:
                return False

        self._until(key, named, proc, self.logs / f"{key}.out")
        self._ns[hostname] = _ns(proc.pid) or ""

    def _start_ctld(self) -> None:
        self._in_namespace("slurmctld", self.name,
                           [self.bin["slurmctld"], "-D", "-f", str(self.conf)])

    def start_node(self, host: str) -> None:
        """Start ``host``'s slurmd (again, after ``kill_node``), in a new UTS namespace named
        ``host``; it registers with the controller (``wait_up`` waits for it to be idle)."""
        if host not in self.hosts:
            raise ValueError(f"{host} is not a node of this cluster ({', '.join(self.hosts)})")
        old = self._procs.get(f"slurmd-{host}")
        if old is not None and old.poll() is None:
            raise RuntimeError(f"{host}'s slurmd is running")
        (self.root / "spool" / host).mkdir(exist_ok=True)
        self._killed.discard(host)
        self._in_namespace(f"slurmd-{host}", host,
                           [self.bin["slurmd"], "-D", "-f", str(self.conf)])

    # -- use ----------------------------------------------------------------------------------

    def env(self, **extra: str) -> dict[str, str]:
        """os.environ (less any other Slurm's variables) with SLURM_CONF naming this cluster's
        configuration: srun, salloc, sbatch, squeue, scancel, scontrol, sinfo talk to it."""
        env = {k: v for k, v in os.environ.items() if not k.startswith(FOREIGN)}
        env["SLURM_CONF"] = str(self.conf)
        env.update(extra)
        return env

    def _namespace_pid(self, host: str) -> int:
        """A live process in ``host``'s namespace (its slurmd, else any)."""
        proc = self._procs.get(f"slurmd-{host}")
        if proc is not None and proc.poll() is None:
            return proc.pid
        for p in self.node_processes(host):
            return p.pid
        raise RuntimeError(f"{host} is down (kill_node): no process left in its namespace")

    def on(self, host: str, command: Sequence[str] | str, **popen_kwargs) -> subprocess.Popen:
        """``command`` run as on ``host``: in that node's own UTS namespace (``nsenter`` into
        its slurmd's; it execs, so the Popen's pid is the command's), with ``env()``. A string
        runs through ``sh -c``; ``env=`` adds variables to ``env()``; it runs in the cluster's
        directory unless ``cwd=`` says (sbatch's slurm-JOBID.out lands there). ``kill_node``
        kills it with the node."""
        if host not in self.hosts:
            raise ValueError(f"{host} is not a node of this cluster ({', '.join(self.hosts)})")
        argv = ["sh", "-c", command] if isinstance(command, str) else list(command)
        env = self.env(**popen_kwargs.pop("env", None) or {})
        popen_kwargs.setdefault("cwd", self.root)
        pid = self._namespace_pid(host)
        return subprocess.Popen([self.bin["nsenter"], f"--uts=/proc/{pid}/ns/uts", "--", *argv],
                                env=env, **popen_kwargs)

    def run(self, command: Sequence[str] | str, host: str | None = None,
            timeout: float = 120, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
        """``command`` (a client: srun, sbatch, squeue, ...) to its end, its output as text;
        from ``host`` where named, else from the test's own host; in the cluster's directory;
        ``env`` adds variables to ``env()``."""
        if host is not None:
            proc = self.on(host, command, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                           text=True, env=env)
        else:
            argv = ["sh", "-c", command] if isinstance(command, str) else list(command)
            proc = subprocess.Popen(argv, env=self.env(**(env or {})), stdout=subprocess.PIPE,
                                    stderr=subprocess.PIPE, text=True, cwd=self.root)
        try:
            stdout, stderr = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            stdout, stderr = proc.communicate()
            raise RuntimeError(f"{command} ran past {timeout} s:\n{stdout}\n{stderr}") from None
        return subprocess.CompletedProcess(proc.args, proc.returncode, stdout, stderr)

    def show(self, entity: str, *ids: str) -> list[dict[str, str]]:
        """``scontrol show -o ENTITY [ID]``: one dict per record (``step``: StepId, State,
        NodeList, ``SrunHost:Pid``, ...); [] when there is none."""
        proc = self.run(["scontrol", "show", "-o", entity, *ids], timeout=30)
        records = []
        for line in proc.stdout.splitlines():
            if "=" not in line:
                continue
            record: dict[str, str] = {}
            key = None
            for token in line.split(" "):
                k, eq, v = token.partition("=")
                if eq and k:
                    key, record[k] = k, v
                elif key is not None and token:  # a value with spaces
                    record[key] += " " + token
            records.append(record)
        return records

    def states(self) -> dict[str, str]:
        """Each node's state as sinfo says it (``idle``, ``allocated``, ``mixed``, ``down*``,
        ...); {} while the controller does not answer."""
        proc = self.run(["sinfo", "-h", "-N", "-o", "%N %T"], timeout=30)
        if proc.returncode != 0:
            return {}
        return dict(line.split(None, 1) for line in proc.stdout.splitlines() if " " in line)

    def wait_up(self, timeout: float = 60) -> float:
        """Until sinfo shows every node idle; the seconds since the cluster's start."""
        deadline = time.monotonic() + timeout
        while True:
            dead = [k for k, p in self._procs.items() if p.poll() is not None
                    and not (k.startswith("slurmd-") and k[7:] in self._killed)]
            if dead:
                raise RuntimeError(f"Slurm cluster: {', '.join(dead)} exited\n" + self.logs_tail())
            states = self.states()
            if all(states.get(h) == "idle" for h in self.hosts):
                return time.monotonic() - self.started
            if time.monotonic() > deadline:
                raise RuntimeError(f"Slurm cluster not up in {timeout} s: sinfo says {states}\n"
                                   + self.logs_tail())
            time.sleep(0.2)

    def logs_tail(self, n: int = 1500) -> str:
        """The end of every daemon's log (for a failure's message)."""
        return "\n".join(_tail(p, n) for p in sorted(self.logs.glob("*")))

    # -- processes ----------------------------------------------------------------------------

    def _in_ns(self, ns: str | None) -> list[psutil.Process]:
        if not ns:
            return []
        found = []
        for p in psutil.process_iter():
            try:
                if _ns(p.pid) == ns and p.status() != psutil.STATUS_ZOMBIE:
                    found.append(p)
            except psutil.Error:
                continue
        return found

    def node_processes(self, host: str) -> list[psutil.Process]:
        """Every live process of ``host``: those in its UTS namespace (its slurmd, slurmstepds,
        the tasks and batch scripts they started, what ``on(host)`` ran); zombies left out."""
        return self._in_ns(self._ns.get(host))

    def _sigkill(self, procs: Iterable[psutil.Process]) -> None:
        for p in procs:
            try:
                p.send_signal(signal.SIGKILL)
            except psutil.Error:
                pass

    def _kill_ns(self, ns: str | None, timeout: float = 10) -> list[int]:
        """SIGKILL every process of a namespace, again until none is left (a dying slurmstepd
        may still fork); their pids."""
        killed: set[int] = set()
        deadline = time.monotonic() + timeout
        while True:
            procs = self._in_ns(ns)
            if not procs:
                return sorted(killed)
            killed.update(p.pid for p in procs)
            self._sigkill(procs)
            psutil.wait_procs(procs, timeout=1)
            if time.monotonic() > deadline:
                raise RuntimeError(f"processes left after SIGKILL: {[p.pid for p in procs]}")

    def kill_node(self, host: str) -> list[int]:
        """``host`` dies: SIGKILL to every process of it at once, its slurmd included (the
        controller marks it down after SlurmdTimeout, 10 s); the pids killed."""
        self._killed.add(host)
        killed = self._kill_ns(self._ns.get(host))
        proc = self._procs.get(f"slurmd-{host}")
        if proc is not None:
            proc.wait(10)
        return killed

    def clients(self) -> list[psutil.Process]:
        """Live processes outside the cluster's namespaces that were given its configuration
        (SLURM_CONF in their environment: srun, salloc, sbatch run by the tests, and their
        tasks), this process and its ancestors left out."""
        mine, skip, found = str(self.conf), _ancestors(), []
        for p in psutil.process_iter():
            try:
                if p.pid in skip or p.status() == psutil.STATUS_ZOMBIE:
                    continue
                if p.environ().get("SLURM_CONF") == mine:
                    found.append(p)
            except (psutil.Error, OSError):
                continue
        return found

    def leftovers(self) -> list[str]:
        """What of the cluster still runs (after ``stop``: nothing): ``PID CMDLINE`` each."""
        procs = {p.pid: p for ns in self._ns.values() for p in self._in_ns(ns)}
        procs.update((p.pid, p) for p in self.clients())
        for proc in self._procs.values():
            if proc.poll() is None:
                try:
                    procs[proc.pid] = psutil.Process(proc.pid)
                except psutil.Error:
                    pass
        left = []
        for pid, p in sorted(procs.items()):
            try:
                left.append(f"{pid} {' '.join(p.cmdline())[:160]}")
            except psutil.Error:
                continue
        return left

    def stop(self) -> None:
        """Stop everything it started: each node's processes (SIGKILL), the clients left with its
        configuration, then slurmctld and munged (SIGTERM, SIGKILL after 10 s). Idempotent; it
        goes on past a failure and raises the first at its end."""
        errors: list[BaseException] = []

        def step(fn, *args) -> None:
            try:
                fn(*args)
            except Exception as err:  # noqa: BLE001 - the rest is still stopped
                errors.append(err)

        for host in self.hosts:
            step(self._kill_ns, self._ns.get(host))
        step(self._stop_clients)
        for key in ("slurmctld", "munged"):
            step(self._terminate, key)
        step(self._kill_ns, self._ns.get(self.name))  # slurmscriptd, slurmctld's child
        for proc in self._procs.values():
            if proc.poll() is None:
                proc.kill()
            proc.wait()
        for f in self._out:
            f.close()
        self._out.clear()
        if errors:
            raise errors[0]

    def _stop_clients(self) -> None:
        clients = self.clients()
        self._sigkill(clients)
        psutil.wait_procs(clients, timeout=5)

    def _terminate(self, key: str) -> None:
        proc = self._procs.get(key)
        if proc is None or proc.poll() is not None:
            return
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()

    def __enter__(self) -> "SlurmCluster":
        try:
            self.wait_up()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
