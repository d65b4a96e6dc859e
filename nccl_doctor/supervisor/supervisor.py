"""The supervisor loop: launch, watch, collect, analyse, report.

While the job runs, ``tick`` runs every ``poll_interval`` and calls the listeners: the live
watchdog (nccl_doctor.watchdog) is one. Once the job has ended, the captures are analysed post
mortem; a hang the watchdog diagnosed stays the report's verdict.
"""

from __future__ import annotations

import enum
import os
import signal
import time
import uuid
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Callable, Sequence

from nccl_doctor.analysis import analyze
from nccl_doctor.capture.directory import (
    REPORT_JSON, Manifest, capture_files, load_capture_dir,
)
from nccl_doctor.diagnosis import Diagnosis
from nccl_doctor.errors import DoctorError, ExitStatus
from nccl_doctor.supervisor.gpu.nvml import GpuSource, Nvml
from nccl_doctor.supervisor.gpu.sampler import GpuSampler
from nccl_doctor.reporters.json import write_report
from nccl_doctor.supervisor.launch import Job, exit_status, job_environment
from nccl_doctor.supervisor.policy import HangPolicy
from nccl_doctor.supervisor.probe import Registry
from nccl_doctor.supervisor.silent_watch import SilentWatch
from nccl_doctor.supervisor.straggler_watch import StragglerWatch
from nccl_doctor.supervisor.view import LiveView
from nccl_doctor.supervisor.watchdog import Watchdog


class State(enum.Enum):
    STARTING = "starting"
    RUNNING = "running"
    ENDED = "ended"
    ANALYSING = "analysing"
    DONE = "done"


_ALLOWED = {
    State.STARTING: {State.RUNNING, State.DONE},
    State.RUNNING: {State.ENDED},
    State.ENDED: {State.ANALYSING},
    State.ANALYSING: {State.DONE},
    State.DONE: set(),
}


@dataclass(frozen=True)
class RunResult:
    exit_status: int
    diagnosis: Diagnosis | None
    report_path: Path | None
    analysis_error: str | None = None
    stopped_orphans: bool = False
    stopped_for_hang: bool = False  # the watchdog stopped the job (--on-hang kill)


class Supervisor:
    def __init__(self, command: Sequence[str], out_dir: Path, *, poll_interval: float = 0.2,
                 environ: dict[str, str] | None = None, policy: HangPolicy | None = HangPolicy(),
                 announce: Callable[[str], None] | None = None,
                 gpu: Callable[[], GpuSource] | None = Nvml.open) -> None:
        """``policy`` None runs no watchdog (post-mortem only); ``announce`` receives the
        watchdog's events (a hang called, the job stopped) as one-line messages; ``gpu`` opens
        the GPUs' NVML (None: no GPU sampling)."""
        self.command = tuple(command)
        self.out_dir = out_dir
        self.poll_interval = poll_interval
        self.environ = dict(os.environ if environ is None else environ)
        self.state = State.STARTING
        self.run_id = uuid.uuid4().hex[:12]
        self.job: Job | None = None
        self._signals = 0
        self.listeners: list[Callable[[Supervisor], None]] = []  # called every tick
        self.watchdog: Watchdog | None = None
        self.silent: SilentWatch | None = None
        self.straggler: StragglerWatch | None = None
        if policy is not None:
            self.watchdog = Watchdog(out_dir, self.run_id, policy, stop_job=self._stop_job,
                                     announce=announce)
            self.listeners.append(self.watchdog)
            self.silent = SilentWatch(out_dir, self.watchdog)
            self.listeners.append(self.silent)
            self.straggler = StragglerWatch(out_dir, self.watchdog)
            self.listeners.append(self.straggler)
        self.gpu: GpuSampler | None = None
        if gpu is not None:
            registry = self.watchdog.registry if self.watchdog is not None else Registry(out_dir)
            watchdog = self.watchdog

            def ranks() -> dict[int, tuple[int, int | None]]:  # this host's: its GPUs only
                if watchdog is None:
                    registry.poll()
                return {r: (p.pid, p.local_rank) for r, p in registry.local().items()}

            self.gpu = GpuSampler(out_dir, ranks=ranks, open_source=gpu,
                                  fast=lambda: watchdog is not None and watchdog.quiet)
            self.listeners.append(self.gpu)

    def attach(self, listener: Callable[[Supervisor], None],
               announce: Callable[[str], None] | None = None) -> None:
        """Call ``listener`` every tick (a live display); ``announce`` gets the watchdog's
        events (a hang called, the job stopped) as one-line messages."""
        self.listeners.append(listener)
        if announce is not None and self.watchdog is not None:
            self.watchdog.announce = announce

    def view(self) -> LiveView | None:
        """The watchdog's live view of the job (None without a watchdog)."""
        return self.watchdog.view() if self.watchdog is not None else None

    def _stop_job(self, sig: int) -> None:
        if self.job is not None:
            self.job.signal(sig)

    def _to(self, new: State) -> None:
        if new not in _ALLOWED[self.state]:
            raise RuntimeError(f"supervisor: {self.state.value} -> {new.value} is not allowed")
        self.state = new

    def run(self) -> RunResult:
        self.out_dir.mkdir(parents=True, exist_ok=True)
        manifest = Manifest(command=self.command, started_at=time.time(), run_id=self.run_id)
        manifest.write(self.out_dir)
        environment = job_environment(self.environ, self.out_dir, self.run_id)
        previous = self._install_signal_forwarding()
        try:
            self.job = Job(self.command, environment)
            self._to(State.RUNNING)
            while (code := self.job.poll()) is None:
                self.tick()
                time.sleep(self.poll_interval)
        except DoctorError:
            self.state = State.DONE
            raise
        finally:
            self._restore_signals(previous)
            if self.gpu is not None:
                self.gpu.close()  # its last sample lands before the analysis reads it
        self._to(State.ENDED)
        stopped = self.job.reap_stragglers()
        status = exit_status(code)
        manifest = replace(manifest, ended_at=time.time(), exit_status=status)
        self._to(State.ANALYSING)
        stopped_for_hang = self.watchdog is not None and self.watchdog.stopped_job
        if stopped_for_hang:
            status = ExitStatus.HANG_STOPPED
            manifest = replace(manifest, exit_status=status)
        diagnosis, report, error = self._analyse(manifest)
        self._to(State.DONE)
        return RunResult(status, diagnosis, report, error, stopped, stopped_for_hang)

    def tick(self) -> None:
        for listener in list(self.listeners):
            try:
                listener(self)
            except Exception as err:  # a listener's failure must never stop the job's supervision
                self.listeners.remove(listener)
                what = getattr(listener, "what", None)  # a watch the user should know is gone
                if what and self.watchdog is not None:
                    self.watchdog.announce(f"{what} failed ({err!r}); it is off from here")

    def _analyse(self, manifest: Manifest) -> tuple[Diagnosis | None, Path | None, str | None]:
        manifest.write(self.out_dir)  # ended_at and the exit status, which the loader reads
        try:
            traces = load_capture_dir(self.out_dir, job_ended=True)
        except DoctorError as err:
            return None, None, str(err)
        hosts = tuple(sorted({t.meta.host for t in traces.ranks.values()}))
        manifest = replace(manifest, world_size=traces.world_size, hosts=hosts,
                           captures=tuple(f.name for f in capture_files(self.out_dir)))
        manifest.write(self.out_dir)
        diagnosis = analyze(traces)
        if self.watchdog is not None:
            diagnosis = self.watchdog.final(diagnosis) or diagnosis
        report = self.out_dir / REPORT_JSON
        write_report(diagnosis, report)
        return diagnosis, report, None

    # -- signals: the job is in its own process group, so forward what the terminal sends -----
    def _install_signal_forwarding(self) -> dict[int, object]:
        previous = {}
        for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
            try:
                previous[sig] = signal.signal(sig, self._forward)
            except ValueError:  # not the main thread (embedded use): nothing to forward
                pass
        return previous

    def _restore_signals(self, previous: dict[int, object]) -> None:
        for sig, handler in previous.items():
            signal.signal(sig, handler)  # type: ignore[arg-type]

    def _forward(self, sig: int, _frame: object) -> None:
        if self.job is None:
            return
        self._signals += 1
        # A third interrupt means "stop now": the job ignored two polite ones.
        self.job.signal(signal.SIGKILL if self._signals >= 3 else sig)
