"""What the terminal sends goes on to the job: the job runs in its own process group, so
SIGINT, SIGTERM and SIGHUP reaching ``nccl-doctor run`` are forwarded to it. The user's first
one is held as an ``Interrupted`` event until the supervisor's loop keeps it (a handler that
wrote watchdog.json could interleave with the loop's own write); a second means "stop now"
(SIGKILL). Ctrl-C is the user's, at the terminal: what the first SIGINT leaves running is
killed a moment later (``CTRL_C_GRACE``: the supervisor's Stopper), so the command ends within
two seconds - a rank blocked in a collective never sees its KeyboardInterrupt.

A signal may also reach the job's processes and not nccl-doctor: Slurm's ``--signal=TERM@60``
goes to the job's steps (the ranks), ``scancel --signal`` without ``--full`` too, and srun then
ends with 128 + the signal. ``outside_end`` reads that end as the interrupt it was."""

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
#: signals a job ends by that someone sent it - a person, a scheduler (``--signal`` may name
#: any; USR1 and USR2 are the usual ones) - where a crash ends by SIGSEGV, SIGABRT or SIGBUS and
#: the OOM killer by SIGKILL
SENT = (*FORWARDED, signal.SIGUSR1, signal.SIGUSR2)
#: seconds the job has to end after the user's Ctrl-C (its own handlers: a checkpoint saved,
#: torchrun ending its workers) before what is left of it is killed
CTRL_C_GRACE = 1.0


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
        return Interrupted((name,), at=at, sender=_with_slurm(sender, at))

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
        sig = signal.SIGKILL if self.count >= 2 else sig
        job = self.job()
        if job is None:  # still being launched: sent once it is (``launched``)
            self._unsent = sig
            return
        job.signal(sig)
        wake = getattr(job, "wake", None)
        if wake is not None:
            wake()  # the supervisor reports the interrupt now, not at its next look


def _with_slurm(sender: str, at: float) -> str:
    """``sender`` with what Slurm says of a signal its batch job got at ``at`` (the time limit,
    preemption, scancel), where it says anything."""
    job_id = os.environ.get(SLURM_JOB_ID)
    if not job_id:
        return sender
    from nccl_doctor.supervisor.slurm.allocation import why_signalled
    why = why_signalled(job_id, at)
    return f"Slurm: {why}" + (f" ({sender})" if sender else "") if why else sender


def outside_end(returncode: int, launcher: str) -> Interrupted | None:
    """The job's end read as an interrupt when its launcher (``launcher``: its command's name)
    ended by a signal someone sent (SENT) - killed by it, or with 128 + it as srun and the
    shells end - that never reached nccl-doctor; None for any other end. (The caller knows
    that nccl-doctor itself sent the job nothing.)"""
    number = -returncode if returncode < 0 else returncode - 128 if returncode > 128 else 0
    try:
        sig = signal.Signals(number)
    except ValueError:
        return None
    if sig not in SENT:
        return None
    from nccl_doctor.watch_log import Interrupted
    at = round(time.time(), 3)
    how = f"killed by {sig.name}" if returncode < 0 else f"with status {returncode}"
    sender = (f"sent to the job's processes, not to nccl-doctor: {launcher} ended {how}")
    return Interrupted((sig.name,), at=at, sender=_with_slurm(sender, at))
