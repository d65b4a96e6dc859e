"""The live job as the supervisor's watches see it: one object for the job (``LiveJob``), one
``Snapshot`` of it per tick handed to every watch, and the ``Decision`` a watch returns.

A watch never writes the report, never stops the job and never prints: it returns a decision
and the supervisor applies it (nccl_doctor/supervisor/supervisor.py).
"""

from __future__ import annotations

import enum
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping, Protocol, Sequence

import psutil

from nccl_doctor.analysis.calls.annotate import Annotator
from nccl_doctor.analysis.calls.ends import Ending, with_ends_known
from nccl_doctor.capture.live_captures import LiveCaptures
from nccl_doctor.diagnosis import Diagnosis
from nccl_doctor.gpu.readings import GpuTrace
from nccl_doctor.gpu.series import GpuLog
from nccl_doctor.errors import DoctorError
from nccl_doctor.model import TraceSet
from nccl_doctor.stacks.rank_stack import RankStack
from nccl_doctor.stacks.samples import SampleLog, StackSample
from nccl_doctor.analysis.calls.situation import ProcState
from nccl_doctor.supervisor import evidence
from nccl_doctor.supervisor.run_files import RunFiles
from nccl_doctor.supervisor.policy import HangPolicy
from nccl_doctor.supervisor.probe import RankProcess, Registry, proc_state
from nccl_doctor.watch_log import WatchEvent


class SampleLogs:
    """The GPU and stack samples beside the captures, as the supervisor's own writers hold
    them (the GPU sampler's ``gpu.jsonl``, the straggler watch's ``stragglers.jsonl``)."""

    def __init__(self, gpu: GpuLog | None, samples: SampleLog | None) -> None:
        self.gpu, self.samples = gpu, samples

    def stamp(self) -> object:
        return (self.gpu.version if self.gpu is not None else None,
                len(self.samples.held) if self.samples is not None else None)

    def read(self) -> tuple[GpuTrace | None, tuple[StackSample, ...], list[str]]:
        return (self.gpu.trace() if self.gpu is not None else None,
                tuple(self.samples.held) if self.samples is not None else (), [])


class LiveJob:
    """The job being watched: its capture directory, run id, ranks (``registry``), hang policy,
    the known-issue annotators and whom to tell (``announce``: one-line messages)."""

    def __init__(self, out_dir: Path, run_id: str, policy: HangPolicy | None, *,
                 annotators: Sequence[Annotator] | None = None,
                 announce: Callable[[str], None] | None = None,
                 clock: Callable[[], float] = time.monotonic,
                 run_files: RunFiles | None = None) -> None:
        self.out_dir, self.run_id, self.policy = out_dir, run_id, policy
        self.annotators = annotators
        self.announce = announce or (lambda _m: None)
        self.clock = clock
        self.registry = Registry(out_dir)
        self.captures = LiveCaptures(out_dir)  # followed: one read per tick feeds every watch
        # what the supervisor decided and wrote, held (the manifest, written at the launch)
        self.run_files = run_files if run_files is not None else RunFiles(out_dir)

    def snapshot(self) -> Snapshot:
        """The ranks' progress counters now (a header read per rank); the captures themselves
        are read on first use, once per snapshot, whichever watch asks first."""
        counts = self.registry.poll()
        return Snapshot(self.clock(), counts, dict(self.registry.notes), self.out_dir,
                        self.registry.poll, self.captures.load, attempt=self.registry.attempt)

    def final(self) -> TraceSet:
        """This host's ranks at the job's end, with the watchdog's evidence: what the post
        mortem analyses (and a replay of the directory reads the same)."""
        traces = self.captures.final(self.run_files.evidence())
        return with_ends_known(traces, Ending.of(traces.watch, ended=True))

    # -- what the watches may look at: this host's ranks here; a multi-node leader
    #    (nccl_doctor/supervisor/federation/) asks the other nodes' supervisors for theirs
    def procs(self, ranks: Sequence[int] | None = None) -> dict[int, ProcState]:
        """One look at each rank's process (default: every rank the registry knows)."""
        return {r: proc_state(pid) for r, pid in self.pids(ranks).items()}

    def stacks(self, ranks: Sequence[int], timeout: float) -> dict[int, RankStack]:
        """The Python stacks of ``ranks`` (py-spy, else the in-rank agent)."""
        return evidence.collect_stacks(self.pids(ranks), self.run_id, timeout=timeout)

    def worker_stacks(self, rank: int, timeout: float, most: int = 4) -> dict[int, RankStack]:
        """The Python stacks of ``rank``'s own child processes (its DataLoader's workers),
        keyed by pid: where a rank waits on its workers, theirs are the stacks that say why.
        Only this host's ranks (a multi-node leader asks nobody: empty)."""
        pid = self.pids([rank]).get(rank)
        if pid is None or rank not in self.local():
            return {}
        try:
            kids = [k.pid for k in psutil.Process(pid).children()][:most]
        except (psutil.Error, OSError):
            return {}
        return evidence.collect_stacks({k: k for k in kids}, self.run_id, timeout=timeout) \
            if kids else {}

    def flight_recorder(self, ranks: Sequence[int], timeout: float,
                        stacks: bool = False) -> dict[int, dict[str, Any]]:
        """The Flight Recorder dumps of ``ranks`` that can answer (``stacks``: with the
        newest entries' Python stacks)."""
        return evidence.flight_recorder_dumps(self.pids(ranks), self.run_id, timeout=timeout,
                                              stacks=stacks)

    def hosts(self) -> dict[int, str]:
        """rank -> its host, for every rank known."""
        return {r: p.host for r, p in self.registry.ranks.items()}

    def unsure(self) -> str:
        """Why what the watches see may be stale now ("": it is not). A multi-node leader
        (FederatedJob) is unsure while a follower is silent but not yet lost."""
        return ""

    def pids(self, ranks: Sequence[int] | None = None) -> dict[int, int]:
        """rank -> pid of ``ranks`` (default: every rank) the registry knows."""
        known = self.registry.ranks
        return {r: known[r].pid for r in (known if ranks is None else ranks) if r in known}

    def local(self) -> dict[int, RankProcess]:
        """This host's ranks: the only ones its supervisor can sample."""
        return self.registry.local()


@dataclass
class Snapshot:
    """One look at the running job, shared by every watch of one tick."""

    at: float  # the supervisor's clock (monotonic seconds)
    counts: dict[int, int]  # rank -> calls recorded so far
    notes: dict[int, int]  # rank -> bytes of silent-error notes written so far
    out_dir: Path
    poll: Callable[[], dict[int, int]] = field(repr=False)  # the counters, read again
    # reads the traces (the followed captures; a multi-node leader adds the other nodes')
    load: Callable[[], TraceSet] = field(repr=False)
    # the counters polled right before the captures were read: what they show at least
    read_counts: dict[int, int] = field(default_factory=dict, repr=False)
    attempt: tuple[int, int] = (0, 0)  # the launch attempt whose ranks these are
    _traces: TraceSet | None = field(default=None, repr=False)
    _read: bool = field(default=False, repr=False)

    @property
    def traces(self) -> TraceSet | None:
        """Every rank's capture as of its first use in this tick (None while none can be
        read)."""
        if not self._read:
            self._read = True
            self.read_counts = self.poll()
            try:
                self._traces = self.load()
            except DoctorError:
                self._traces = None
        return self._traces


class Report(enum.Enum):
    """What a decision's diagnosis is: a hang outranks a suspicion."""

    HANG = "hang"  # a hang was called (or retracted): it replaces any report
    SUSPECT = "suspect"  # silent errors: written unless a hang report stands


@dataclass(frozen=True)
class Decision:
    """What a watch asks the supervisor to do."""

    report: Diagnosis | None = None  # write it as report.json
    kind: Report = Report.HANG
    announce: tuple[str, ...] = ()  # one-line messages for the user
    stop_job: bool = False  # stop the job (SIGTERM, then SIGKILL after the policy's grace)
    end_ranks: bool = False  # end the ranks' processes only: the launcher restarts them
    rank_pids: tuple[int, ...] = ()  # those ranks' processes, where no capture names them
    # what to keep beside the captures for replay (nccl_doctor/capture/watch_record.py): the
    # watchdog's account of this decision, the stacks and Flight Recorder pulls it used
    record: WatchEvent | None = None
    stacks: Mapping[int, RankStack] | None = None
    fr_dumps: Mapping[int, Mapping[str, Any]] | None = None
    traces: TraceSet | None = None  # the captures the report was drawn from (report.html's)


class Watch(Protocol):
    what: str  # named when it fails (the supervisor then drops it and says so)

    def look(self, snap: Snapshot) -> Decision | None: ...
