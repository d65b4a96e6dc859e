"""Start the job in its own process group with the recorder injected; forward signals; reap.
A reaper process (nccl_doctor/supervisor/reaper.py) stops the job if the supervisor is killed."""

from __future__ import annotations

import os
import select
import signal
import subprocess
import time
from pathlib import Path
from typing import Iterable, Mapping, Sequence

from nccl_doctor import env
from nccl_doctor.errors import LaunchFailed
from nccl_doctor.processes import started
from nccl_doctor.supervisor.reaper import Reaper

_PACKAGE = Path(__file__).resolve().parent.parent  # nccl_doctor/
# the sitecustomize every Python process of the job loads (a file of the rank side, not imported)
BOOTSTRAP_DIR = _PACKAGE / "rank" / "_bootstrap"
PACKAGE_PARENT = _PACKAGE.parent


def job_environment(base: Mapping[str, str], capture_dir: Path, run_id: str) -> dict[str, str]:
    """The job's environment: the user's, plus what arms the recorder in every Python process."""
    out = {k: v for k, v in base.items() if k not in env.NOT_FOR_RANKS}
    paths = [str(BOOTSTRAP_DIR)] + [p for p in out.get("PYTHONPATH", "").split(os.pathsep) if p]
    out["PYTHONPATH"] = os.pathsep.join(paths)
    out[env.CAPTURE_DIR] = str(capture_dir.absolute())
    out[env.PACKAGE_PARENT] = str(PACKAGE_PARENT)
    out[env.BOOTSTRAP_PATH] = str(BOOTSTRAP_DIR)
    out[env.RUN_ID] = run_id
    return out


def _exit_fd(pid: int) -> int | None:
    """A descriptor that becomes readable when process ``pid`` exits (Linux 5.3+: a pidfd);
    None where there is none."""
    try:
        return os.pidfd_open(pid)
    except (AttributeError, OSError):
        return None


class Job:
    """The launched command: a process-group leader whose group is the whole job."""

    def __init__(self, command: Sequence[str], environment: Mapping[str, str],
                 out_dir: Path | None = None) -> None:
        """``out_dir``: the capture directory, where a reaper that had to stop the job (the
        supervisor was killed) says so; None starts no reaper."""
        # the reaper first: a supervisor killed the instant after the launch leaves no job
        self.reaper = (Reaper(out_dir, environment.get(env.RUN_ID, ""))
                       if out_dir is not None else None)
        try:
            # Its own session and process group: the supervisor can stop the job as a whole, and
            # the terminal's Ctrl-C reaches the supervisor, which forwards it.
            self.proc = subprocess.Popen(list(command), env=dict(environment), start_new_session=True)
        except OSError as err:
            if self.reaper is not None:  # nothing ran: nothing for it to guard
                self.reaper.release()
            why = ("command not found (is it installed, on PATH?)"
                   if isinstance(err, FileNotFoundError) else "permission denied"
                   if isinstance(err, PermissionError) else err.strerror)
            raise LaunchFailed(f"cannot run {command[0]!r}: {why}") from None
        self.pgid = self.proc.pid
        self.started = time.time()
        self._exited = _exit_fd(self.proc.pid)
        # written by ``wake`` (a signal's handler): the supervisor's wait ends at once, so that
        # an interrupt is reported before a scheduler's SIGKILL follows its SIGTERM
        self._wake = _pipe()
        # The ranks, by pid -> start time: torchrun starts each worker in a session of its own,
        # which a signal to the job's process group never reaches (a SIGKILL of the launcher then
        # orphans them), so they are signalled one by one as well.
        self._ranks: dict[int, float] = {}
        if self.reaper is not None:
            self.reaper.job(self.pgid)

    @property
    def pid(self) -> int:
        return self.proc.pid

    def poll(self) -> int | None:
        return self.proc.poll()

    def wait(self, timeout: float) -> int | None:
        """The launcher's exit status once it exits within ``timeout`` s (None: still running):
        the supervisor sees the job's end at once, not at its next look."""
        if self._exited is not None:  # readable once the launcher has exited
            ready, _, _ = select.select([self._exited, *self._wake[:1]], [], [], timeout)
            if self._wake and self._wake[0] in ready:
                _drain(self._wake[0])
            return self.proc.poll()
        try:  # (sleeps of up to 50 ms between looks)
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            return None

    def wake(self) -> None:
        """End the supervisor's current wait (safe in a signal handler)."""
        if self._wake:
            try:
                os.write(self._wake[1], b"\0")
            except OSError:  # full (a wake pending already), or closed
                pass

    def adopt(self, pids: Iterable[int]) -> None:
        """Count these processes (the ranks this host's registry found) as the job's."""
        for pid in pids:
            if pid > 0 and pid not in self._ranks:
                created = started(pid)
                if created is None:
                    continue
                self._ranks[pid] = created
                if self.reaper is not None:
                    self.reaper.adopt(pid, created)

    def _outside(self) -> list[int]:
        """Adopted ranks still running outside the job's process group (a pid now reused by
        another process does not count: its start time differs). Called from more than one
        thread (the supervisor's loop, a signal passed on, a caller's stop)."""
        out = []
        for pid, created in list(self._ranks.items()):
            alive = started(pid) == created
            try:
                outside = alive and os.getpgid(pid) != self.pgid
            except OSError:
                alive = outside = False
            if not alive:  # (another thread - a stop, a signal passed on - may have seen it)
                self._ranks.pop(pid, None)
            elif outside:
                out.append(pid)
        return out

    def signal(self, sig: int) -> None:
        """Send ``sig`` to every process of the job: its process group and the adopted ranks
        outside it."""
        try:
            os.killpg(self.pgid, sig)
        except ProcessLookupError:
            pass
        for pid in self._outside():
            try:
                os.kill(pid, sig)
            except OSError:
                pass

    def group_alive(self) -> bool:
        """Whether any process of the job is left (its group, or an adopted rank)."""
        try:
            os.killpg(self.pgid, 0)
        except ProcessLookupError:
            return bool(self._outside())
        except PermissionError:
            return True
        return True

    def reap_stragglers(self, grace: float = 5.0, kill: bool = False) -> bool:
        """After the leader exits, give leftover processes ``grace`` seconds, then stop them:
        SIGTERM, and SIGKILL five seconds later - or at once (``kill``: after the user's
        Ctrl-C, which they had already).

        Returns True if any process had to be stopped (an orphan the launcher left behind).
        """
        deadline = time.monotonic() + grace
        while self.group_alive() and time.monotonic() < deadline:
            time.sleep(0.05)
        if not self.group_alive():
            return False
        if kill:
            self.signal(signal.SIGKILL)
            return True
        self.signal(signal.SIGTERM)
        deadline = time.monotonic() + 5.0
        while self.group_alive() and time.monotonic() < deadline:
            time.sleep(0.1)
        if self.group_alive():
            self.signal(signal.SIGKILL)
        return True

    def release(self) -> None:
        """The job is reaped: its reaper may go (without touching anything)."""
        if self._exited is not None:
            os.close(self._exited)
            self._exited = None
        wake, self._wake = self._wake, ()  # (a signal's handler writes to it no more)
        for fd in wake:
            os.close(fd)
        if self.reaper is not None:
            self.reaper.release()
            self.reaper = None


def exit_status(returncode: int) -> int:
    """A shell's view of a return code: killed by signal N -> 128 + N."""
    return 128 - returncode if returncode < 0 else returncode


def _pipe() -> tuple[int, ...]:
    """A pipe, both ends non-blocking (a full one drops a wake: one is pending); () where none
    can be made."""
    try:
        r, w = os.pipe()
    except OSError:
        return ()
    os.set_blocking(r, False)
    os.set_blocking(w, False)
    return r, w


def _drain(fd: int) -> None:
    try:
        while os.read(fd, 64):
            pass
    except OSError:  # (empty: BlockingIOError)
        pass
