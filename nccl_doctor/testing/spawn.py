"""A launcher as small as ``srun`` or ``mpirun`` on one node, for the pytest plugin's distributed
tests (and the suite's jobs whose subject is not the launcher): it starts ``--nproc`` ranks of a
script (or ``-m module``) with torch's environment contract (MASTER_ADDR/MASTER_PORT on a free loopback port, RANK, LOCAL_RANK, WORLD_SIZE,
LOCAL_WORLD_SIZE, GROUP_RANK, OMP_NUM_THREADS=1), waits for them, and ends as torchrun does:
the first rank to fail stops the others (SIGTERM half a second later, then SIGKILL after a grace
period) and the
launcher exits 1 (torchrun's status for a failed worker); SIGTERM or SIGINT to the launcher goes
to every rank.

It imports no torch: a job under it costs one torch start-up less than under torchrun (about a
third of the CPU of a small 2-rank job on a 2-core machine), and nothing of torchrun's elastic
agent is needed to run a test's ranks once.

    python -m nccl_doctor.testing.spawn --nproc 2 job.py [ARGS...]
    python -m nccl_doctor.testing.spawn --nproc 2 -m package.module [ARGS...]
    python -m nccl_doctor.testing.spawn --zygote SOCKET --nproc 2 job.py [ARGS...]

``--zygote SOCKET``: the ranks are forked by a fork server that has imported torch already
(testing/zygote.py), each becoming what ``python job.py`` would have been, instead of started
fresh; this process then waits for them as for its own children. Where the server refuses
(CUDA initialised in it) or cannot be reached, the ranks start fresh.

MASTER_PORT is a port the kernel just handed out and released (as torch's own tests pick one):
another process may take it before rank 0 binds it, rarely enough on one machine.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Protocol, Sequence

GRACE = 10.0  # seconds between SIGTERM and SIGKILL, as torchrun's
#: Seconds between the first failed rank and the SIGTERM to the others: its peers, whose
#: collectives it broke, fail on their own within it (their errors recorded, not cut short by
#: the launcher's signal), as they did in the half second a fresh Python takes to tear down.
SETTLE = 0.5


class Rank(Protocol):
    returncode: int | None

    def poll(self) -> int | None: ...

    def send_signal(self, sig: int) -> None: ...


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Refused(Exception):
    """The fork server will not fork (or cannot be reached): start the ranks fresh."""


class Forked:
    """A rank the fork server started: its exit status comes over the server's connection."""

    def __init__(self, client: Client, pid: int) -> None:
        self.client, self.pid, self.returncode = client, pid, None
        try:
            self._pidfd: int | None = os.pidfd_open(pid)  # signals never reach a reused pid
        except OSError:  # it has ended already (and been reaped): its status is on its way
            self._pidfd = None

    def poll(self) -> int | None:
        self.client.receive()
        return self.returncode

    def send_signal(self, sig: int) -> None:
        if self.returncode is None and self._pidfd is not None:
            try:
                signal.pidfd_send_signal(self._pidfd, sig)
            except OSError:
                pass

    def ended(self, returncode: int) -> None:
        self.returncode = returncode
        if self._pidfd is not None:
            os.close(self._pidfd)
            self._pidfd = None


class Client:
    """One connection to the fork server; while it is open the server keeps this client's ranks
    (it SIGKILLs them when the connection closes before they ended: this process was killed)."""

    def __init__(self, path: str) -> None:
        self.ranks: dict[int, Forked] = {}
        try:
            self.conn = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
            self.conn.connect(path)
            refused = self._ask({"hello": True}).get("refused")
        except (OSError, ValueError) as err:
            raise Refused(f"fork server at {path}: {err}") from None
        if refused:
            raise Refused(str(refused))

    def _ask(self, message: dict, fds: list[int] | None = None) -> dict:
        data = json.dumps(message).encode()
        if fds:
            socket.send_fds(self.conn, [data], fds)
        else:
            self.conn.send(data)
        while True:
            reply = json.loads(self.conn.recv(1 << 16) or b'{"refused": "the server closed"}')
            if "exit" not in reply:
                return reply
            self._ended(reply)

    def fork(self, argv: list[str], environ: dict[str, str]) -> Forked:
        fds = [_usable(fd) for fd in (0, 1, 2)]
        try:
            reply = self._ask({"fork": True, "argv": argv, "env": environ, "cwd": os.getcwd()},
                              fds)
        except (OSError, ValueError) as err:
            raise Refused(f"fork server: {err}") from None
        finally:
            for fd, std in zip(fds, (0, 1, 2)):
                if fd != std:
                    os.close(fd)
        if "pid" not in reply:
            raise Refused(str(reply.get("refused", "no answer")))
        rank = self.ranks[reply["pid"]] = Forked(self, reply["pid"])
        return rank

    def receive(self) -> None:
        """Take in the exit statuses the server has sent (without waiting)."""
        while True:
            try:
                data = self.conn.recv(1 << 16, socket.MSG_DONTWAIT)
            except BlockingIOError:
                return
            except OSError:
                data = b""
            if not data:  # the server is gone, and its ranks with it (their death signal)
                for rank in self.ranks.values():
                    if rank.returncode is None:
                        rank.ended(-signal.SIGKILL)
                return
            self._ended(json.loads(data))

    def _ended(self, reply: dict) -> None:
        rank = self.ranks.get(reply.get("exit"))
        if rank is not None:
            rank.ended(os.waitstatus_to_exitcode(reply["status"]))


def _usable(fd: int) -> int:
    """``fd``, or /dev/null opened in its place if this process has no such descriptor."""
    try:
        os.fstat(fd)
        return fd
    except OSError:
        return os.open(os.devnull, os.O_RDWR)


def start(target: list[str], environs: list[dict[str, str]], zygote: str | None) -> list[Rank]:
    """The ranks, forked by the server at ``zygote`` when it can, else fresh processes."""
    forkable = bool(target) and (target[0] == "-m" and len(target) > 1
                                 or not target[0].startswith("-"))
    if zygote and forkable:
        try:
            client = Client(zygote)
        except Refused:
            client = None
        if client is not None:
            forked: list[Rank] = []
            try:
                for environ in environs:
                    forked.append(client.fork(target, environ))
                return forked
            except Refused as err:
                for rank in forked:
                    rank.send_signal(signal.SIGKILL)
                if forked:
                    raise SystemExit(f"nccl_doctor.testing.spawn: {err}") from None
    return [subprocess.Popen([sys.executable, *target], env=environ) for environ in environs]


def command(nproc: int, target: Sequence[str], *, fork: bool = True) -> list[str]:
    """The command line starting ``nproc`` ranks of ``target`` (a script and its arguments, or
    ``-m MODULE ...``): forked by this process's fork server (testing/zygote.py) where it can
    (``fork``), else fresh processes."""
    from nccl_doctor.testing import zygote

    server = zygote.address() if fork else None
    if server is None:
        return [sys.executable, "-m", "nccl_doctor.testing.spawn", "--nproc", str(nproc),
                *target]
    # A client that imports no torch needs no site either: ``-S`` spares it the doctor's
    # sitecustomize, which arms the recorder in every Python process of the job (about 0.1 s of
    # imports; the forked ranks have them already, the client never records).
    return [sys.executable, "-S", "-c", _CLIENT.format(parent=str(Path(__file__).parents[2])),
            "--zygote", server, "--nproc", str(nproc), *target]


_CLIENT = ("import sys; sys.path.insert(0, {parent!r}); "
           "from nccl_doctor.testing.spawn import main; sys.exit(main(sys.argv[1:]))")


def main(argv: list[str]) -> int:
    zygote = None
    if argv[:1] == ["--zygote"] and len(argv) > 1:
        zygote, argv = argv[1], argv[2:]
    if len(argv) < 3 or argv[0] != "--nproc":
        print("usage: python -m nccl_doctor.testing.spawn --nproc N (SCRIPT | -m MODULE) "
              "[ARGS...]; --zygote SOCKET first: the ranks forked by a fork server",
              file=sys.stderr)
        return 2
    nproc, target = int(argv[1]), argv[2:]
    base = dict(os.environ, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()),
                WORLD_SIZE=str(nproc), LOCAL_WORLD_SIZE=str(nproc), GROUP_RANK="0")
    base.setdefault("OMP_NUM_THREADS", "1")
    ranks = start(target, [dict(base, RANK=str(r), LOCAL_RANK=str(r)) for r in range(nproc)],
                  zygote)

    def stop(sig: int, _frame: object = None) -> None:
        for p in ranks:
            if p.poll() is None:
                try:
                    p.send_signal(sig)
                except ProcessLookupError:
                    pass

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    failed: int | None = None
    terminate_at = kill_at = 0.0
    while [p.poll() for p in ranks].count(None):  # (every rank polled: its status is set)
        now = time.monotonic()
        if failed is None:
            failed = next((p.returncode for p in ranks if p.returncode not in (None, 0)), None)
            if failed is not None:
                terminate_at, kill_at = now + SETTLE, now + SETTLE + GRACE
        elif terminate_at and now >= terminate_at:
            stop(signal.SIGTERM)
            terminate_at = 0.0
        elif not terminate_at and now > kill_at:
            stop(signal.SIGKILL)
        time.sleep(0.05)
    return 0 if failed is None and all(p.returncode == 0 for p in ranks) else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
