"""The captures of a running job, read as the job writes them: each look costs the records
written since the previous one (capture/follow.py)."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Protocol

from nccl_doctor.capture import joining
from nccl_doctor.capture import format as fmt
from nccl_doctor.capture.assemble import assemble, beside, contents
from nccl_doctor.capture.capture_set import CaptureSet, passed_over
from nccl_doctor.capture.evidence import Evidence
from nccl_doctor.capture.follow import CaptureFollower, Scan
from nccl_doctor.capture.manifest import Manifest
from nccl_doctor.capture.names import (
    EARLY_EXIT_SUFFIX, JOINING_SUFFIX, FolderChanges, capture_files)
from nccl_doctor.capture.union import newest_per_rank, of_attempt
from nccl_doctor.capture.window import DEFAULT, P2P_WHOLE, Size
from nccl_doctor.env import own_launch
from nccl_doctor.errors import DoctorError
from nccl_doctor.gpu.readings import GpuTrace
from nccl_doctor.gpu.series import GPU_JSONL
from nccl_doctor.model import Event, EventKind, RankTrace, TraceSet
from nccl_doctor.stacks.samples import STRAGGLERS_JSONL, StackSample


class Beside(Protocol):
    """The GPU samples and the stragglers' stack samples beside the captures."""

    def stamp(self) -> object:
        """Changes whenever what ``read`` gives changes."""

    def read(self) -> tuple[GpuTrace | None, tuple[StackSample, ...], list[str]]:
        """(the GPU samples, the stack samples, problems reading them)."""


class FilesBeside:
    """Read from their files (``gpu.jsonl``, ``stragglers.jsonl``) when these change."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory

    def stamp(self) -> object:
        return tuple(_stamp(self.directory / name) for name in (GPU_JSONL, STRAGGLERS_JSONL))

    def read(self) -> tuple[GpuTrace | None, tuple[StackSample, ...], list[str]]:
        return beside(self.directory)


class LiveCaptures:
    """The captures of a running job, followed (capture/follow.py): ``load()`` costs the records
    written since the previous one, and returns the previous ``TraceSet`` itself when nothing
    changed - the watches and the silent checks all share it, and may cache on its identity.
    ``final()`` is the job at its end, from what the followers hold (the post mortem).

    ``manifest``: the run's manifest as its writer holds it (None: read from the directory);
    ``beside``: where the GPU and stack samples come from (default: their files)."""

    def __init__(self, directory: Path, window: Size = DEFAULT, *,
                 beside: Beside | None = None) -> None:
        self.directory = directory
        self.window = window
        self.manifest: Manifest | None = None
        self.beside: Beside = beside or FilesBeside(directory)
        self._final: tuple[Evidence | None, TraceSet] | None = None
        self._followers: dict[Path, CaptureFollower] = {}
        self._read: list[RankTrace | DoctorError] = []
        self._beside: tuple[tuple, tuple] = ((), ())  # (stamps, what) of gpu.jsonl & stragglers
        self._cut: dict[int, tuple[RankTrace, RankTrace]] = {}  # id -> (trace, its newest part)
        self._last: TraceSet | None = None
        # (a Slurm requeue's own launch, as in supervisor/probe.py's Registry)
        self._marker_attempts: set[tuple[int, int]] = {own_launch()}
        #: the launch attempts seen so far (more than one: the launcher restarted the job)
        self.attempts: set[tuple[int, int]] = set()
        self._folder = FolderChanges(directory)
        self._listing: tuple[tuple[Manifest | None, list[Path], list[str]], list[Path]] = (
            (None, [], []), [])

    def load(self) -> TraceSet:
        """The job as its captures show it now (ranks still running: no exit yet). The folder
        is listed again only when it changed (capture/names.py ``FolderChanges``); in between
        a look reads each capture's counters and what moved."""
        moved_folder = self._list()
        (manifest, files, damage), others = self._listing
        read = [self._follow(f, moved_folder) for f in files]
        stamps: tuple = (self.beside.stamp(),)
        # a rank that could not make its capture, or raised before joining, is news too,
        # though no capture moved
        stamps += tuple((p.name, _stamp(p)) for p in others)
        moved = stamps != self._beside[0]
        if moved:
            self._beside = (stamps, self.beside.read())
            # the launch attempts whose ranks raised or began joining before any capture
            self._marker_attempts = set(joining.launches_begun(self.directory)) | {own_launch()}
        same = len(read) == len(self._read) and all(a is b for a, b in zip(read, self._read))
        if same and not moved and self._last is not None:
            return self._last
        self._read = read
        gpu, samples, problems = self._beside[1]
        found = [(f, t) for f, t in zip(files, read) if isinstance(t, RankTrace)]
        # a launcher's restart: the latest attempt alone, never a rank of one beside another's
        self.attempts |= {t.meta.attempt for _, t in found} | self._marker_attempts
        attempt = max({t.meta.attempt for _, t in found} | self._marker_attempts, default=None)
        latest, _ = of_attempt(found, lambda ft: ft[1].meta.attempt, attempt)
        newest, passed = newest_per_rank(latest, lambda ft: (ft[1].rank, ft[1].meta.started_ns))
        chosen = {id(t) for _, t in newest.values()}
        picked = [t if not isinstance(t, RankTrace) or id(t) in chosen else None for t in read]
        notes = [passed_over((a, ta.meta), (b, tb.meta)) for (a, ta), (b, tb) in passed]
        self._last = assemble(self.directory, manifest, files, self._tails(picked), gpu, samples,
                              damage + problems, notes, attempt)
        return self._last

    def final(self, evidence: Evidence | None = None) -> TraceSet:
        """The job at its end, for the post mortem, with the supervisor's ``evidence``
        attached (every rank gone; their ends decided by the caller: analysis/calls/ends.py): a
        ``CaptureSet`` of what the followers hold - each capture's last records read, nothing
        decoded again - and past ``window.above`` records the window a replay sees."""
        if self._final is None or self._final[0] is not evidence:
            captures = CaptureSet.followed(self.directory, self._columns,
                                           manifest=self.manifest, beside=self.beside.read(),
                                           evidence=evidence, window=self.window)
            self._final = (evidence, captures.traces())
            self.attempts |= set(captures.attempts())  # (every capture's, as they were read)
        return self._final[1]

    def _list(self) -> bool:
        """The folder listed again when it may hold other files than last time (or the
        manifest changed); whether it was."""
        if not self._folder.moved(self.manifest):
            return False
        others = [p for suffix in (fmt.UNRECORDED_SUFFIX, EARLY_EXIT_SUFFIX, JOINING_SUFFIX)
                  for p in sorted(self.directory.glob(f"*{suffix}"))]
        self._listing = (self._contents(), others)
        return True

    def _contents(self) -> tuple[Manifest | None, list[Path], list[str]]:
        if self.manifest is None:
            return contents(self.directory)
        return self.manifest, capture_files(self.directory), []

    def _columns(self, path: Path) -> Scan:
        follower = self._followers.get(path)
        if follower is None:  # a capture never looked at (made at the very end)
            follower = self._followers[path] = CaptureFollower(path)
        return follower.columns()

    def _tails(self, read: list[RankTrace | DoctorError | None]
               ) -> list[RankTrace | DoctorError | None]:
        """Past ``window.above`` records in all, each rank's newest ones only (``window.tails``
        shared, at least ``window.tail`` each): a look at a running job is about how it stands now,
        and full rings would make each look's analysis cost seconds. (A replay, and the
        supervisor's own post mortem, see the window: ``final``.)"""
        traces = [t for t in read if isinstance(t, RankTrace)]
        if sum(len(t.events) for t in traces) <= self.window.above:
            return read
        tail = self.window.per_rank(len(traces))
        cut = {}
        for t in traces:
            held = self._cut.get(id(t))
            if held is None or held[0] is not t:
                events, whole = _newest(t.events, tail)
                held = (t, replace(t, events=events, recorded=t.records, p2p_whole=whole))
            cut[id(t)] = held
        self._cut = cut
        return [cut[id(t)][1] if isinstance(t, RankTrace) else t for t in read]

    def _follow(self, path: Path, moved_folder: bool = True) -> RankTrace | DoctorError:
        follower = self._followers.get(path)
        try:
            if follower is None:  # (a file being created may not be readable yet: next time)
                follower = self._followers[path] = CaptureFollower(path)
            return follower.read(moved_folder)
        except DoctorError as err:
            return err

    def close(self) -> None:
        for follower in self._followers.values():
            follower.close()
        self._followers.clear()


def _newest(events: tuple[Event, ...], tail: int) -> tuple[tuple[Event, ...], bool]:
    """The newest ``tail`` events, with every point-to-point message before them (up to
    ``window.P2P_WHOLE``), the waits on them and their parents, and whether every message is
    there (capture/window.py keeps the same: a channel is paired message by message from its
    first)."""
    older = events[:-tail] if tail < len(events) else ()
    p2p = {e.idx for e in older if e.kind is EventKind.P2P}
    if not p2p:
        return tuple(events[-tail:]), True
    if len(p2p) > P2P_WHOLE:
        return tuple(events[-tail:]), False
    keep = p2p | {e.parent for e in older if e.idx in p2p and e.parent}
    keep |= {e.idx for e in older if e.parent in p2p}
    return tuple(e for e in older if e.idx in keep) + tuple(events[-tail:]), True


def _stamp(path: Path) -> tuple[int, int] | None:
    try:
        st = path.stat()
    except OSError:
        return None
    return st.st_size, st.st_mtime_ns
