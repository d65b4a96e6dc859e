"""What the terminal sends goes on to the job: the job runs in its own process group, so
SIGINT, SIGTERM and SIGHUP reaching ``nccl-doctor run`` are forwarded to it. The user's first
one is held as an ``Interrupted`` event until the supervisor's loop keeps it (a handler that
wrote watchdog.json could interleave with the loop's own write); a third means "stop now"
(SIGKILL): the job ignored two polite ones."""

from __future__ import annotations

import os
import signal
import time
from typing import TYPE_CHECKING, Callable

from nccl_doctor.env import SLURM_JOB_ID
from nccl_doctor.supervisor import senders
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
        self._pending: tuple[float, str, str] | None = None  # when, which signal, who sent it
        self._unsent: int | None = None  # came while the job was being launched
        self._previous: dict[int, object] = {}

    def install(self) -> None:
        for sig in FORWARDED:
            try:
                self._previous[sig] = signal.signal(sig, self._forward)
            except ValueError:  # not the main thread (embedded use): nothing to forward
                continue
            senders.watch(sig)  # (who sends it: kept in front of the handler just installed)

    def restore(self) -> None:
        for sig, handler in self._previous.items():
            senders.unwatch(sig)
            signal.signal(sig, handler)  # type: ignore[arg-type]
        self._previous = {}

    def take_interrupt(self) -> Interrupted | None:
        """The user's first interrupt, once (None: none, or already taken)."""
        pending, self._pending = self._pending, None
        if pending is None:
            return None
        from nccl_doctor.watch_log import Interrupted
        at, name, sender = pending
        job_id = os.environ.get(SLURM_JOB_ID)
        if job_id:  # a batch job's signal: the time limit, preemption, scancel?
            from nccl_doctor.supervisor.slurm.allocation import why_signalled
            why = why_signalled(job_id, at)
            sender = f"Slurm: {why}" + (f" ({sender})" if sender else "") if why else sender
        return Interrupted((name,), at=at, sender=sender)

    def launched(self) -> None:
        """The job is launched: a signal that came while it was being launched (its processes
        may already run and print) goes to it now."""
        job, sig = self.job(), self._unsent
        self._unsent = None
        if job is not None and sig is not None:
            job.signal(sig)

    def _forward(self, sig: int, _frame: object) -> None:
        if self.count == 0 and not self.quiet():
            self._pending = (round(time.time(), 3), signal.Signals(sig).name,
                             senders.sender(sig))
        self.count += 1
        sig = signal.SIGKILL if self.count >= 3 else sig
        job = self.job()
        if job is None:  # still being launched: sent once it is (``launched``)
            self._unsent = sig
            return
        job.signal(sig)
        wake = getattr(job, "wake", None)
        if wake is not None:
            wake()  # the supervisor reports the interrupt now, not at its next look
