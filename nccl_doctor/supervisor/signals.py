"""What the terminal sends goes on to the job: the job runs in its own process group, so
SIGINT, SIGTERM and SIGHUP reaching ``nccl-doctor run`` are forwarded to it. The user's first
one is held as an ``Interrupted`` event until the supervisor's loop keeps it (a handler that
wrote watchdog.json could interleave with the loop's own write); a third means "stop now"
(SIGKILL): the job ignored two polite ones."""

from __future__ import annotations

import signal
import time
from typing import TYPE_CHECKING, Callable

from nccl_doctor.supervisor.launch import Job

if TYPE_CHECKING:  # (made in the supervisor's loop: nothing is imported in a signal handler)
    from nccl_doctor.watch_log import Interrupted

FORWARDED = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


class SignalForwarder:
    def __init__(self, job: Callable[[], Job | None], quiet: Callable[[], bool]) -> None:
        """``job()``: the job to forward to (None before it started: nothing to forward);
        ``quiet()``: whether an interrupt now is no news (the job is being stopped for a
        hang: the ranks' ends are nccl-doctor's doing already)."""
        self.job, self.quiet = job, quiet
        self.count = 0
        self._pending: tuple[float, str] | None = None  # when, and which signal
        self._unsent: int | None = None  # came while the job was being launched
        self._previous: dict[int, object] = {}

    def install(self) -> None:
        for sig in FORWARDED:
            try:
                self._previous[sig] = signal.signal(sig, self._forward)
            except ValueError:  # not the main thread (embedded use): nothing to forward
                pass

    def restore(self) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)  # type: ignore[arg-type]
        self._previous = {}

    def take_interrupt(self) -> Interrupted | None:
        """The user's first interrupt, once (None: none, or already taken)."""
        pending, self._pending = self._pending, None
        if pending is None:
            return None
        from nccl_doctor.watch_log import Interrupted
        return Interrupted((pending[1],), at=pending[0])

    def launched(self) -> None:
        """The job is launched: a signal that came while it was being launched (its processes
        may already run and print) goes to it now."""
        job, sig = self.job(), self._unsent
        self._unsent = None
        if job is not None and sig is not None:
            job.signal(sig)

    def _forward(self, sig: int, _frame: object) -> None:
        if self.count == 0 and not self.quiet():
            self._pending = (round(time.time(), 3), signal.Signals(sig).name)
        self.count += 1
        sig = signal.SIGKILL if self.count >= 3 else sig
        job = self.job()
        if job is None:  # still being launched: sent once it is (``launched``)
            self._unsent = sig
            return
        job.signal(sig)
