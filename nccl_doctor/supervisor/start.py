"""A run's first steps: ``--out`` made and claimed, the manifest written, the terminal's signals
forwarded, the job launched. Light on purpose (no numpy, no analysis, no watches): ``nccl-doctor
run`` takes these steps before it imports the supervisor, whose parts are built while the job's
ranks start (each spends a second or more importing torch), so that the job starts as soon as
it would bare (docs/benchmarks/run_edges.md). A multi-node or cluster run takes them inside the
supervisor instead: there the leader listens before any rank starts.
"""

from __future__ import annotations

import os
import time
import uuid
from dataclasses import replace
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

from nccl_doctor import redact
from nccl_doctor.capture.claim import Claim
from nccl_doctor.capture.manifest import Manifest
from nccl_doctor.env import host_name
from nccl_doctor.errors import LaunchFailed, OutDirInUse, unwritable
from nccl_doctor.processes import started
from nccl_doctor.supervisor.launch import Job, job_environment
from nccl_doctor.supervisor.run_files import RunFiles
from nccl_doctor.supervisor.signals import SignalForwarder


class Launch:
    """The job of one run in ``out_dir``, from the claim of the directory to the launch."""

    def __init__(self, command: Sequence[str], out_dir: Path,
                 environ: Mapping[str, str] | None = None) -> None:
        self.command = tuple(command)
        self.out_dir = out_dir
        self.environ = dict(os.environ if environ is None else environ)
        self.run_id = uuid.uuid4().hex[:12]
        self.files = RunFiles(out_dir)  # the run's own files: the manifest first
        self.job: Job | None = None
        #: whether an interrupt now is no news (the supervisor stopping the job for its hang)
        self.stopping: Callable[[], bool] = lambda: False
        self.signals = SignalForwarder(lambda: self.job, lambda: self.stopping())
        self._claim: Claim | None = None
        self._created: list[Path] = []

    @property
    def manifest(self) -> Manifest | None:
        """The manifest as written at the launch (None before)."""
        return self.files.manifest

    def begin(self, extra: Mapping[str, Any] | None = None,
              before_start: Callable[[], None] | None = None) -> Job:
        """Every step, in order: claim ``out_dir``, write the manifest (``extra``: its word on
        this supervisor, by default ``supervisor_entry()``), forward the terminal's signals, run
        ``before_start`` (a multi-node leader listens, a cluster's node doctors are prepared),
        launch the job. A step that fails undoes the rest (a failed launch raises
        ``LaunchFailed``, its manifest taken back)."""
        self.claim()
        self._write_manifest(supervisor_entry() if extra is None else extra)
        self.signals.install()
        try:
            if before_start is not None:
                before_start()
            job = self._start()
        except BaseException:
            self.signals.restore()
            self.undo()
            raise
        self.signals.launched()
        return job

    def claim(self) -> None:
        """Make ``out_dir`` and hold it for this run alone (capture/claim.py: another live
        run's directory is refused)."""
        if self._claim is not None:
            return
        try:
            created = _make_dir(self.out_dir)
        except OSError as err:  # before anything started: the user picks another --out
            raise unwritable("--out", self.out_dir, err) from None
        try:
            self._claim = Claim(self.out_dir, self.command)
        except OutDirInUse:
            remove_empty(created)
            raise
        except OSError as err:
            remove_empty(created)
            raise unwritable("--out", self.out_dir, err) from None
        self._created = created

    def _write_manifest(self, extra: Mapping[str, Any]) -> None:
        """The manifest as the run starts (replay of an unfinished run reads it)."""
        manifest = Manifest(command=self.command, started_at=time.time(), run_id=self.run_id,
                            extra=dict(extra), redacted=redact.wanted(self.environ))
        try:
            self.files.write_manifest(manifest)
        except OSError as err:  # before anything started: the user picks another --out
            raise unwritable("--out", self.out_dir, err) from None

    def _start(self) -> Job:
        """Launch the job (``LaunchFailed``: nothing ran, the manifest is taken back)."""
        environment = job_environment(self.environ, self.out_dir, self.run_id)
        try:
            self.job = Job(self.command, environment, self.out_dir)
        except LaunchFailed:
            self.files.forget_manifest()
            raise
        return self.job

    def ended(self, exit_status: int) -> Manifest:
        """The manifest as the job ended (not written here: the post mortem adds what it found
        and writes it)."""
        assert self.manifest is not None
        return replace(self.manifest, ended_at=time.time(), exit_status=exit_status)

    def unwatched(self) -> int:
        """The supervisor could not be built: the job runs on to its end as if bare (the
        terminal's signals still reach it); its exit status."""
        assert self.job is not None
        try:
            while (code := self.job.poll()) is None:
                self.job.wait(1.0)
            return code
        finally:
            self.signals.restore()
            self.job.reap_stragglers()
            self.job.release()
            self.release()

    def undo(self) -> None:
        """Nothing ran: the claim released, the directories this run made removed if empty,
        so that nothing is left behind to block ``--out``."""
        self.release()
        remove_empty(self._created)

    def release(self) -> None:
        if self._claim is not None:
            self._claim.release()


def supervisor_entry() -> dict[str, Any]:
    """The manifest's word on this supervisor (replay of an unfinished run asks whether it
    still runs)."""
    return {"supervisor": {"pid": os.getpid(), "host": host_name(),
                           "started": started(os.getpid())}}


def _make_dir(path: Path) -> list[Path]:
    """``mkdir -p path``; the directories it created, outermost first."""
    missing = []
    for p in [path, *path.parents]:
        if p.exists():
            break
        missing.append(p)
    path.mkdir(parents=True, exist_ok=True)
    return list(reversed(missing))


def remove_empty(created: list[Path]) -> None:
    """The directories a run made (outermost first), removed where they are still empty."""
    for folder in reversed(created):
        try:
            folder.rmdir()
        except OSError:  # not empty (the user's files, or files of another run), or gone
            pass
