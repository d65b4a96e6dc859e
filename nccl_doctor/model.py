"""The typed trace model: what a loaded capture directory is.

Produced by ``nccl_doctor.capture.reader``; consumed by the analysis passes. Frozen dataclasses and
enums only: no I/O, no torch.
"""

from __future__ import annotations

import enum
import functools
import re
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Mapping

from nccl_doctor import call_path
from nccl_doctor.env import attempt_of
from nccl_doctor.capture.format import EventFlag, EventKind, EventState
from nccl_doctor.location import Location
from nccl_doctor.words import BY_USER

if TYPE_CHECKING:  # (a rank imports this module to record: only the types it holds)
    from nccl_doctor.gpu.readings import GpuTrace
    from nccl_doctor.stacks.rank_stack import RankStack
    from nccl_doctor.stacks.samples import StackSample
    from nccl_doctor.watch_log import WatchLog


__all__ = [
    "EventSource", "Location", "Event", "EventFlag", "EventKind", "EventState", "ExitKind",
    "RankExit", "RankMeta", "Integrity", "RankTrace", "GroupInfo", "TraceSet", "TensorSig",
    "Unrecorded", "EarlyExit", "Joining", "parse_tensor_desc",
]


@dataclass(frozen=True)
class TensorSig:
    """One tensor (or uniform tensor list) as the recorder described it: ``4*float32[2,7,32]``."""

    dtype: str
    shape: tuple[int, ...]
    count: int = 1  # members of a uniform list; 1 for a single tensor

    def __str__(self) -> str:
        dims = ",".join(str(d) for d in self.shape)
        return f"{self.count}*{self.dtype}[{dims}]" if self.count != 1 else f"{self.dtype}[{dims}]"


_SIG = re.compile(r"^(?:(\d+)\*)?([A-Za-z0-9_.]+)\[([0-9,]*)\]$")


@functools.lru_cache(maxsize=4096)
def parse_tensor_desc(desc: str) -> tuple[TensorSig, ...]:
    """Parse the recorder's tensor description (``;``-separated for non-uniform lists)."""
    sigs = []
    for part in desc.split(";") if desc else ():
        m = _SIG.match(part.strip())
        if not m:
            continue
        count, dtype, dims = m.groups()
        shape = tuple(int(d) for d in dims.split(",") if d)
        sigs.append(TensorSig(dtype, shape, int(count) if count else 1))
    return tuple(sigs)


class EventSource(enum.Enum):
    """Who saw a call: the in-rank recorder (Python API), or PyTorch's Flight Recorder (calls
    issued from C++, e.g. DDP's gradient all_reduce, merged in by capture/flight_recorder.py)."""

    RECORDER = "recorder"
    FUNCTIONAL = "functional"  # the recorder, at the functional collectives' dispatcher entry
    FLIGHT_RECORDER = "flight_recorder"


@dataclass(frozen=True)
class Event:
    """One recorded call into torch.distributed."""

    idx: int  # 1-based record number within the rank's capture
    parent: int  # idx of the enclosing recorded call (object collective, async op), 0 if none
    kind: EventKind
    op: str
    group: str  # process group name (PyTorch's group_name)
    seq: int  # PyTorch's per-group sequence number of this call (-1: not known)
    seq_offset: int  # p2p calls that bumped the group's sequence number before this one
    seq_delta: int | None  # how much the call advanced the group's sequence number (None: no exit)
    state: EventState
    flags: EventFlag
    t_enter_ns: int
    t_exit_ns: int | None
    thread: int
    input: str  # tensor description, e.g. "float32[2,7,32]"
    output: str
    nbytes: int
    peer: int  # root (src/dst) of a rooted collective, or the p2p peer, as a global rank; -1 none
    group_size: int
    callsite: Location | None  # first frame outside torch and the libraries that wrap it
    api_callsite: Location | None  # first frame outside torch: the direct caller of the API
    # the frames outside torch from the API's caller out to ``callsite`` (at most 16, innermost
    # first): the library line that decided to make the call lies between them. Empty when the
    # capture predates call paths (format 1) or for a call Flight Recorder saw alone
    path: tuple[Location, ...] = ()
    source: EventSource = EventSource.RECORDER
    # returned on the CPU (an NCCL call, unwaited async work) but Flight Recorder shows its work
    # not completed: the rank still waits in it (its state then reads ENTERED)
    in_flight: bool = False
    # when the collective's kernel started on the GPU (Flight Recorder's
    # time_discovered_started_ns, NCCL with TORCH_NCCL_ENABLE_TIMING=1), if known: an NCCL call
    # returns once enqueued, so this, not t_enter_ns, is when the rank arrived
    t_gpu_start_ns: int | None = None
    # a call issued from C++ (seen by Flight Recorder only), in a few words: "issued from C++",
    # or what its stack says made it ("issued from C++ during backward"; capture/
    # flight_recorder.py); "" for a call made through the Python API
    context: str = ""
    # when the collective's kernel completed on the GPU, on the rank's own clock (Flight
    # Recorder's time_discovered_completed_ns, known with t_gpu_start_ns): start to completion is
    # the rank's time in the collective, which stragglers compare across hosts
    t_gpu_end_ns: int | None = None

    @property
    def align_seq(self) -> int:
        """Sequence number of a collective among the group's collectives (p2p bumps removed)."""
        return self.seq - self.seq_offset if self.seq >= 0 else -1

    @property
    def frames(self) -> tuple[Location, ...]:
        """Its recorded call path, else its user's line alone (a capture from before call
        paths, a call Flight Recorder saw alone): what is read for the loops around it."""
        return self.path or ((self.callsite,) if self.callsite is not None else ())

    @property
    def is_composite(self) -> bool:
        flags = self.flags
        return flags is not EventFlag.NONE and bool(flags & EventFlag.COMPOSITE)

    @property
    def done(self) -> bool:
        return self.state is not EventState.ENTERED

    @property
    def where(self) -> str:
        return str(self.callsite or self.api_callsite or "?")

    @property
    def issuing(self) -> Location | None:
        """The line that decided to make the call (nccl_doctor/call_path.py): in real jobs
        usually a library's (``trl/trainer/cpo_trainer.py:839``), else the user's. Without a
        recorded path: the user's line, as before call paths were recorded."""
        if self.path:
            return call_path.issuing(self.path, self.callsite)
        return self.callsite or self.api_callsite


class ExitKind(enum.Enum):
    RUNNING = "running"  # no sign of an exit (live capture, or the job was still running)
    CLEAN = "exit"  # the interpreter shut down normally (atexit ran)
    EXCEPTION = "exception"  # an uncaught exception ended the main thread
    SIGNAL = "signal"  # a fatal signal (SIGABRT, SIGSEGV, ...) caught by faulthandler
    VANISHED = "vanished"  # the process is gone with no record of how: SIGKILL, OOM killer, os._exit
    # nccl-doctor stopped it after diagnosing a hang (--on-hang kill): it was alive, hung, until
    # then (``signal`` names what was sent)
    STOPPED = "stopped"
    # its host was lost: the node's supervisor stopped answering with the rank still running (a
    # multi-node job; ``exception`` names the host). Nothing more is known about its end.
    LOST = "lost"
    # no exit record, but its work had finished (analysis/calls/ends.py): it destroyed its process
    # group, or its last collective completed, no peer needed it and the job exited 0 - a
    # launcher that ends its processes without Python's atexit (Ray's workers, os._exit, a
    # launcher's SIGKILL after success). Not a failure.
    FINISHED = "finished"


@dataclass(frozen=True)
class RankExit:
    kind: ExitKind
    code: int | None = None  # exit status when known
    signal: str | None = None  # signal name when known
    exception: str | None = None  # "RuntimeError: message"
    callsite: Location | None = None  # where the exception / signal hit (innermost user frame)
    time_ns: int | None = None

    @property
    def was_running(self) -> bool:
        """Alive when the capture ends: still running, or stopped by nccl-doctor for a hang."""
        return self.kind in (ExitKind.RUNNING, ExitKind.STOPPED)

    @property
    def abnormal(self) -> bool:
        if self.kind in (ExitKind.EXCEPTION, ExitKind.SIGNAL, ExitKind.VANISHED, ExitKind.LOST):
            return True
        return self.kind is ExitKind.CLEAN and self.code not in (None, 0)

    def describe(self, short: bool = False) -> str:
        if self.kind is ExitKind.EXCEPTION and short and self.exception:
            # gloo/NCCL messages start with "[/path/to/file.cc:123] ": keep what follows
            tp, _, msg = self.exception.partition(": ")
            msg = re.sub(r"^\[[^\]]*\]\s*", "", msg)
            text = f"raised {tp}: {msg}"
            return text if len(text) <= 60 else text[:57] + "..."
        if self.kind is ExitKind.CLEAN:
            return "exited cleanly" if not self.code else f"exited with status {self.code}"
        if self.kind is ExitKind.EXCEPTION:
            return f"raised {self.exception}"
        if self.kind is ExitKind.SIGNAL:
            return f"was killed by {self.signal}"
        if self.kind is ExitKind.VANISHED:
            return ("ended with no exit record (SIGKILL, the OOM killer, a launcher's SIGTERM "
                    "or os._exit)")
        if self.kind is ExitKind.FINISHED:
            return "finished its work, then ended with no exit record (its launcher skipped " \
                "Python's atexit: Ray, os._exit, a kill after success)" if not short else \
                "finished (no exit record)"
        if self.kind is ExitKind.LOST:
            return f"was lost with its host {self.exception}" if self.exception else \
                "was lost with its host"
        if self.kind is ExitKind.STOPPED and self.signal and self.signal.endswith(BY_USER):
            return f"was interrupted ({self.signal})"
        if self.kind is ExitKind.STOPPED:
            sent = f" ({self.signal})" if self.signal else ""
            return f"was stopped by nccl-doctor{sent} after the hang was diagnosed"
        return "was still running"


@dataclass(frozen=True)
class RankMeta:
    rank: int
    world_size: int
    local_rank: int | None
    node_rank: int | None
    host: str
    pid: int
    started_ns: int
    run_id: str = ""
    argv: tuple[str, ...] = ()
    versions: Mapping[str, str] = field(default_factory=dict)
    env: Mapping[str, str] = field(default_factory=dict)
    # a Ray actor's rank: actor_class, actor_id, actor_name, node_id, job_id (rank/ray_actor.py)
    ray: Mapping[str, str] = field(default_factory=dict)
    # the fingerprint of each source file on its call paths, as it was at the run (path ->
    # files.source_digest): the analysis reads a file's source only while it is unchanged
    sources: Mapping[str, str] = field(default_factory=dict)
    # its interpreter's prefixes (console scripts below them are library code: paths.py)
    prefixes: tuple[str, ...] = ()

    @property
    def attempt(self) -> tuple[int, int]:
        """Which launch of the job this process belongs to (env.attempt_of: the scheduler's
        requeues, the elastic launcher's restarts, as its recorded environment says)."""
        return attempt_of(self.env)


#: Torn records a killed rank may leave (one per thread that was inside a call); more is damage.
TORN_BY_A_KILL = 4


@dataclass(frozen=True)
class Integrity:
    """What the reader could not trust in one capture file."""

    torn_records: int = 0  # records whose CRC failed (a write cut off by a kill, or corruption)
    truncated: bool = False  # the file is shorter than its header says
    overwritten: int = 0  # oldest records lost to the ring wrapping (bounded capture)
    bad_strings: int = 0  # string table entries that failed their CRC
    size: int = 0  # bytes in the file, and bytes its header says it has (when truncated)
    expected: int = 0
    miscounted: bool = False  # its header's counters stop short of what it holds
    blank_records: int = 0  # slots below its newest record found blank (zeroed)
    unnamed_records: int = 0  # records naming strings its table does not hold (skipped)
    deep_damage: int = 0  # torn or blank records further from the ring's head than a kill leaves

    @property
    def complete(self) -> bool:
        return not (self.torn_records or self.truncated or self.bad_strings or self.miscounted
                    or self.blank_records or self.unnamed_records)

    @property
    def damaged(self) -> bool:
        """More is wrong than a kill leaves (the record or two each thread was writing): the
        file was cut short, its strings are corrupt, or records fail their check across the
        ring. What such a capture lacks is not evidence against its rank."""
        return (self.truncated or self.miscounted or bool(self.bad_strings)
                or bool(self.unnamed_records) or bool(self.deep_damage)
                or self.torn_records + self.blank_records > TORN_BY_A_KILL)

    def describe(self) -> str:
        parts = []
        if self.truncated:
            parts.append(f"truncated at {self.size:,} of {self.expected:,} bytes"
                         if self.expected else "file truncated")
        if self.miscounted:
            parts.append("its header disagrees with what the file holds (every record read)")
        if self.torn_records:
            parts.append(f"{self.torn_records} torn record(s)")
        if self.blank_records:
            parts.append(f"{self.blank_records} record(s) blanked")
        if self.unnamed_records:
            parts.append(f"{self.unnamed_records} record(s) naming lost strings, skipped")
        if self.bad_strings:
            parts.append(f"{self.bad_strings} corrupt string(s)")
        if self.overwritten:
            parts.append(f"{self.overwritten} oldest event(s) overwritten by the ring")
        return ", ".join(parts) or "complete"


@dataclass(frozen=True)
class GroupInfo:
    name: str
    ranks: tuple[int, ...]  # global ranks, in group-rank order
    backend: str = ""
    desc: str = ""


@dataclass(frozen=True)
class RankTrace:
    meta: RankMeta
    events: tuple[Event, ...]
    exit: RankExit
    integrity: Integrity
    path: str = ""
    notes: tuple[Mapping[str, Any], ...] = ()
    # records in the capture when ``events`` holds only a window of them (a large replay:
    # nccl_doctor/capture/window.py); None: ``events`` is every record
    recorded: int | None = None
    # a window (``recorded``) that kept every point-to-point record, with the waits on them
    # and their parents: its channels can be counted (analysis/calls/p2p_channels.py)
    p2p_whole: bool = False
    # its records name their call paths (False: a capture of format 1, from before them)
    paths_recorded: bool = True

    @property
    def records(self) -> int:
        """Records the capture holds (``events`` may be a window of them)."""
        return len(self.events) if self.recorded is None else self.recorded

    @property
    def rank(self) -> int:
        return self.meta.rank

    def last_event(self) -> Event | None:
        return self.events[-1] if self.events else None


@dataclass(frozen=True)
class Unrecorded:
    """A rank that ran but could not make its capture (capture/unrecorded.py): why, and the
    host it ran on ("" when its marker did not say)."""

    why: str
    host: str = ""
    damaged: bool = False  # it made a capture, which cannot be read (``why`` says what is wrong)


@dataclass(frozen=True)
class EarlyExit:
    """A rank ended by an uncaught exception before it joined a process group, so before its
    capture existed (capture/early_exit.py): what it raised, where, and on which host."""

    exception: str  # "KeyError: 'lr'"
    callsite: Location | None = None  # the innermost frame of the traceback in the user's code
    host: str = ""
    pid: int = 0
    time_ns: int | None = None
    # it raised inside init_process_group: it reached the rendezvous and a peer never came (a
    # timeout) - a consequence when another rank raised before joining
    in_init: bool = False
    traceback: tuple[Location, ...] = ()  # its innermost frames, innermost first (at most 8)
    attempt: tuple[int, int] = (0, 0)  # which launch of the job (env.attempt_of)


@dataclass(frozen=True)
class Joining:
    """A rank that began ``init_process_group`` (capture/joining.py): what is known of it
    before its capture exists - and all that is, if the call never returned."""

    rank: int
    world_size: int
    local_world_size: int | None  # ranks its launcher started on its host (None: not said)
    host: str
    pid: int
    time_ns: int
    address: str  # where it meets the others: "MASTER_ADDR:MASTER_PORT" or the init_method
    backend: str = ""
    attempt: tuple[int, int] = (0, 0)  # which launch of the job (env.attempt_of)


@dataclass(frozen=True)
class TraceSet:
    """Every rank of one job, as loaded from a capture directory."""

    ranks: Mapping[int, RankTrace]
    groups: Mapping[str, GroupInfo]
    world_size: int
    command: tuple[str, ...] = ()
    exit_status: int | None = None  # the launched command's exit status, when the supervisor saw it
    problems: tuple[str, ...] = ()  # files the loader skipped or could only partly read
    source: str = ""
    # (step, {metric: value}) rows parsed from a training log (replay --log), when the captures
    # recorded no metrics themselves
    metrics_log: tuple[tuple[int | None, Mapping[str, float]], ...] = ()
    gpu: GpuTrace | None = None  # the GPU samples beside the captures (gpu.jsonl), if any
    # stack samples of late ranks taken while their peers waited (stragglers.jsonl)
    stack_samples: tuple[StackSample, ...] = ()
    # what the live watchdog decided and did (watchdog.json), and the stacks it took then
    watch: WatchLog | None = None
    stacks: Mapping[int, RankStack] = field(default_factory=dict)
    # why these captures cover only some hosts of a multi-node job ("" : the whole job); the
    # ranks without a capture then ran elsewhere, unseen - never "missing"
    partial: str = ""
    # ranks that ran but could not make a capture (capture/unrecorded.py): seen nowhere, never
    # "missing"
    unrecorded: Mapping[int, Unrecorded] = field(default_factory=dict)
    # ranks that raised before they joined a process group, so left no capture
    # (capture/early_exit.py): how they ended is known, what they did is not
    early_exits: Mapping[int, EarlyExit] = field(default_factory=dict)
    # ranks that began init_process_group and have no capture: it never returned (or the
    # capture could not be made - then ``unrecorded`` says so too)
    joining: Mapping[int, Joining] = field(default_factory=dict)
    # why the job's end is unknown ("" : it ended, or nothing says otherwise): still running,
    # or its supervisor was lost; then ranks behind their peers are not missing, only behind
    unfinished: str = ""

    def damaged_ranks(self) -> frozenset[int]:
        """Ranks whose capture is damaged (unreadable, or read only in part): what it lacks
        says nothing about them - never missing, crashed or a culprit for it."""
        return frozenset([*(r for r, u in self.unrecorded.items() if u.damaged),
                          *(r for r, t in self.ranks.items() if t.integrity.damaged)])

    def all_accounted_for(self) -> bool:
        """Every rank of the world has a capture here, ran unrecorded (never "missing") or
        raised before joining."""
        return all(r in self.ranks or r in self.unrecorded or r in self.early_exits
                   for r in range(self.world_size))

    def group_members(self, name: str) -> tuple[int, ...]:
        info = self.groups.get(name)
        if info is not None and info.ranks:
            return info.ranks
        return tuple(r for r, t in self.ranks.items() if any(e.group == name for e in t.events))
