"""One live run per capture directory: the supervisor claims its ``--out`` for as long as it runs.

The claim is an exclusive ``flock`` (which Linux carries over NFS as a lock of its lock manager)
on ``.nccl-doctor.lock`` in the directory, which says who holds it - host, pid, start
and command - so that a second run pointed at the same directory (even with ``--force``) is
refused with one line naming the first, before it removes or writes anything. The kernel drops
the lock when its holder dies however it dies (SIGKILL, the OOM killer): a file left behind by a
killed run claims nothing, and the next run takes it over. ``default_out`` names a directory of
its own for every run, on every host (time, host and pid), created atomically.
"""

from __future__ import annotations

import errno
import fcntl
import json
import os
import time
from pathlib import Path
from typing import Sequence

from nccl_doctor import bounded_json
from nccl_doctor.env import host_name
from nccl_doctor.errors import OutDirInUse
from nccl_doctor.files import read_regular
from nccl_doctor.capture.names import LOCK

DEFAULT_PARENT = Path("nccl-doctor-out")


class Claim:
    """This process's hold on a capture directory (``release`` ends it)."""

    def __init__(self, directory: Path, command: Sequence[str]) -> None:
        self.path = directory / LOCK
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as err:
            os.close(fd)
            if err.errno in (errno.EACCES, errno.EAGAIN):
                raise OutDirInUse(in_use(directory, holder(self.path))) from None
            raise
        self._fd: int | None = fd
        who = {"host": host_name(), "pid": os.getpid(), "started_at": time.time(),
               "command": [str(a) for a in command][:32]}
        os.ftruncate(fd, 0)
        os.pwrite(fd, json.dumps(who).encode()[:16384], 0)

    def release(self) -> None:
        """End the claim and remove its file (the directory then holds only the run's files)."""
        if self._fd is None:
            return
        try:
            self.path.unlink()
        except OSError:
            pass
        os.close(self._fd)  # closing the descriptor drops the lock
        self._fd = None


def held(directory: Path) -> str | None:
    """Who holds ``directory`` (the one line refusing it), or None when no live run does."""
    path = directory / LOCK
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)  # (a FIFO of that name never waits)
    except OSError:
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except OSError as err:
        if err.errno in (errno.EACCES, errno.EAGAIN):
            return in_use(directory, holder(path))
        return None
    finally:
        os.close(fd)  # (a lock this probe took goes with it)
    return None


def holder(path: Path) -> dict:
    """What the claim's file says of its holder (empty if it cannot be read)."""
    try:
        data = bounded_json.loads(read_regular(path, 16384))
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def in_use(directory: Path, who: dict) -> str:
    started = who.get("started_at")
    when = (time.strftime(" since %Y-%m-%d %H:%M:%S", time.localtime(started))
            if isinstance(started, (int, float)) else "")
    command = who.get("command")
    shown = (" ".join(str(a) for a in command)[:120] if isinstance(command, list) else "")
    what = (f"pid {who.get('pid', '?')} on host {who.get('host', '?')}{when}"
            + (f": {shown}" if shown else ""))
    return (f"--out {directory} is in use by a live nccl-doctor run ({what}); choose another "
            "directory (--force never takes a running job's directory)")


def default_out(now: float | None = None) -> Path:
    """A new directory under ``nccl-doctor-out/`` for this run alone, created now: named by the
    time, the host and the pid, so that runs started in the same second - in two terminals, a
    job array, every node of an ``srun`` on a shared filesystem - never share one."""
    stamp = time.strftime("run-%Y%m%d-%H%M%S", time.localtime(now))
    host = "".join(c if c.isalnum() or c in "-_." else "_" for c in host_name())[:64]
    base = f"{stamp}-{host or 'host'}-{os.getpid()}"
    DEFAULT_PARENT.mkdir(parents=True, exist_ok=True)
    for n in range(1000):
        path = DEFAULT_PARENT / (base if n == 0 else f"{base}-{n}")
        try:
            path.mkdir()  # atomic: exactly one run creates it
        except FileExistsError:
            continue
        return path
    raise FileExistsError(errno.EEXIST, "no free run directory name", str(DEFAULT_PARENT))
