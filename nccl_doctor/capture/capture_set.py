"""One job's captures, read once: ``CaptureSet``, what replay, ``nccl_doctor.open``, ``export``
and the supervisor's post mortem all read through.

A set is given what replay accepts - a capture directory, one ``.ndcap`` file, a directory of
PyTorch Flight Recorder dumps, several nodes' capture directories or one directory holding
them - and reads each thing once, when first asked for:

- the directories: node directories expanded, the leader's first (``directories``);
- each directory's ``manifest.json`` and its kept evidence (``watchdog.json``, ``stacks.json``,
  ``flight_recorder/``: capture/evidence.py) (``manifest``, ``evidence``);
- the captures: the newest of each rank across every directory, picked once (``chosen``), from
  the headers or, where every file was scanned anyway, from the scans;
- the records as columns (``scan``: reader.py ``CaptureColumns``, each file read and checked in
  one pass by a few threads at once; a follower's ``Scan`` for the supervisor's post mortem),
  made into ``Event`` views only for the rows the passes see (``traces``; past ``window.above``
  records, a window of them: capture/window.py - each capture outlined and let go as it is
  read, the window's rows read again from their slots once the window is known).

How each rank ended is the analysis's to decide (analysis/calls/loaded.py): ``traces`` takes that
decision as a function of what each directory says of the job's end (``JobEnd``), so nothing
here imports the analysis.
"""

from __future__ import annotations

import os
from collections import deque
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Callable, Iterable, Iterator, Sequence, TypeVar

import numpy as np

from nccl_doctor.capture import (
    early_exit, flight_recorder, fr_dump, fr_parallel, joining, lifecycle, records, window)
from nccl_doctor.capture import format as fmt
from nccl_doctor.capture.assemble import assemble, beside, contents, groups_from_notes
from nccl_doctor.capture.evidence import Evidence, read_evidence, with_evidence
from nccl_doctor.capture.follow import RECENT, Scan
from nccl_doctor.capture.manifest import MANIFEST, Manifest, read_manifest
from nccl_doctor.capture.reader import CaptureColumns, _meta, read_columns, read_counters
from nccl_doctor.capture.union import Attempt, newest_per_rank, of_attempt, union
from nccl_doctor.errors import DoctorError, ExitStatus
from nccl_doctor.gpu.readings import GpuTrace
from nccl_doctor.model import RankMeta, RankTrace, TraceSet
from nccl_doctor.stacks.samples import StackSample

#: Told (captures read, captures in all) as a set reads its captures (replay's progress bar).
_PROGRESS: ContextVar[Callable[[int, int], None] | None] = ContextVar("nccl_doctor_reading",
                                                                     default=None)


@contextmanager
def reading_progress(told: Callable[[int, int], None]) -> Iterator[None]:
    """Within this block every ``CaptureSet`` tells ``told`` how far it has read."""
    token = _PROGRESS.set(told)
    try:
        yield
    finally:
        _PROGRESS.reset(token)


@dataclass(frozen=True)
class JobEnd:
    """What one capture directory says of the job's end beyond each rank's own record."""

    ended: bool  # the job is over: a rank with no exit record is not running
    # nccl-doctor stopped the job (its manifest says so) but when is lost (watchdog.json damaged)
    stop_unknown: bool = False


#: A capture as read: its records as columns (a file read whole, reader.read_columns), or as
#: the rows a follower holds (``CaptureSet.followed``).
Read = Scan | CaptureColumns
#: Captures read at once, each by a thread of its own (the ring is read and checked in C
#: without the GIL: capture/records.py read_ring), a few files ahead of their consumer.
WORKERS = min(4, os.cpu_count() or 1)

#: Decides each rank's end in one directory's traces (analysis/calls/loaded.py ``settle``).
Settle = Callable[[TraceSet, JobEnd], TraceSet]
Beside = tuple[GpuTrace | None, tuple[StackSample, ...], list[str]]
_Pair = tuple[tuple[Path, RankMeta], tuple[Path, RankMeta]]  # (older, newer) of one rank


def as_recorded(traces: TraceSet, _end: JobEnd) -> TraceSet:
    """Each rank's end as its capture says it, nothing decided."""
    return traces


def is_capture(path: Path) -> bool:
    if path.is_file():
        return path.suffix == fmt.CAPTURE_SUFFIX
    return (path / MANIFEST).is_file() or any(path.glob(f"*{fmt.CAPTURE_SUFFIX}"))


def node_dirs(path: Path) -> list[Path]:
    """The per-node capture directories directly under ``path`` (after an rsync, or on a shared
    filesystem), when ``path`` holds no capture of its own; else []."""
    if not path.is_dir() or is_capture(path):
        return []
    return sorted(d for d in path.iterdir() if d.is_dir() and is_capture(d))


class CaptureSet:
    """The captures of one job (see the module's docstring). ``fr``: the job's own Flight
    Recorder dumps, merged by (process group, sequence number); ``window``: how many records in
    all make the passes see a window of them; ``evidence``: attach what the live watchdog kept;
    ``job_ended``: whether the job is over (default: each manifest's end time says); ``replay``:
    read what replay reads beyond captures (a directory of Flight Recorder dumps), say what it
    says (a run whose end is unknown, one rank's file read alone) and write a lost supervisor's
    end into its manifest (lifecycle.py) - else capture directories only; ``hold_columns``:
    keep every capture's columns once read while they are few (``window.above`` records in all:
    ``nccl_doctor.open``, its tables and its traces from one read; a larger job's are read again
    for each, not held twice in memory).

    A job past ``window.above`` records is never held whole: each capture's records are read,
    outlined for the window (capture/window.py ``Outline``) and let go; once the window is known,
    the few records it keeps of each rank are read again from their slots, checked again and
    compared with the first read (a capture that changed meanwhile - a rank still writing - is
    read afresh)."""

    def __init__(self, *paths: Path | str, fr: Path | None = None,
                 window: window.Size = window.DEFAULT, evidence: bool = True,
                 job_ended: bool | None = None, replay: bool = True,
                 hold_columns: bool = False, attempt: Attempt | None = None) -> None:
        if not paths:
            raise TypeError("a CaptureSet needs at least one path")
        self.paths = tuple(Path(p) for p in paths)
        self.fr = fr
        self.window, self.attach, self.job_ended, self.replay = window, evidence, job_ended, replay
        self.hold_columns = hold_columns
        self.attempt = attempt  # the launch attempt read (None: the latest: ``attempts``)
        self._read: Callable[[Path], Read] = read_file
        self._rereads = True  # ``_read`` reads files (again): not a followed set's held rows
        self._past = False  # the records read so far are past the window: outlines only
        self._held_rows = 0  # records held for hold_columns; past window.above, none is
        self._manifests: dict[Path, Manifest | None | DoctorError] = {}
        self._evidence: dict[Path, Evidence] = {}
        self._beside: dict[Path, Beside] = {}
        self._contents: dict[Path, tuple[Manifest | None, list[Path], list[str]]] = {}
        self._scans: dict[Path, Read | DoctorError] = {}
        self._headers: dict[Path, RankMeta | None] = {}
        self._chosen: tuple[dict[int, Path], dict[int, RankMeta], list[_Pair]] | None = None
        self._found: list[tuple[Path, RankMeta]] | None = None  # every capture's, once read
        self._dumps: dict[Path, bool] = {}
        self._directories: list[Path] | None = None
        self._traces: dict[Settle, TraceSet] = {}
        self._window = _Window({})  # the last window made

    @classmethod
    def followed(cls, directory: Path, columns: Callable[[Path], Read], *,
                 manifest: Manifest | None, beside: Beside, evidence: Evidence | None,
                 window: window.Size = window.DEFAULT) -> CaptureSet:
        """The captures of a job its supervisor followed, at its end: the records from what the
        followers hold (``columns``), the manifest, samples and evidence as the supervisor holds
        them (``manifest`` None: read from the directory) - no file it wrote is read back."""
        made = cls(directory, window=window, evidence=evidence is not None, job_ended=True,
                   replay=False)
        made._read = columns
        made._rereads = False
        made._directories = [directory]
        if manifest is not None:
            made._manifests[directory] = manifest
        made._beside[directory] = beside
        if evidence is not None:
            made._evidence[directory] = evidence
        return made

    # -- what is where --------------------------------------------------------------------------
    @property
    def directories(self) -> list[Path]:
        """Each capture directory (or file, or dump directory) of the job, node directories
        expanded, the leader's first (its watchdog record is the job's), then by node rank."""
        if self._directories is None:
            expanded = [d for p in self.paths for d in (node_dirs(p) or [p])]
            found = list(dict.fromkeys(expanded))
            if len(expanded) > 1:
                found.sort(key=self._lead_order)  # stable: the order given otherwise
            self._directories = found
        return self._directories

    def is_dumps(self, path: Path) -> bool:
        """``path`` holds Flight Recorder dumps, not a capture (read as such by replay)."""
        if path not in self._dumps:
            self._dumps[path] = (self.replay and path.exists() and not is_capture(path)
                                 and fr_dump.is_dump_dir(path))
        return self._dumps[path]

    @property
    def capture_dirs(self) -> list[Path]:
        return [d for d in self.directories if not self.is_dumps(d)]

    def manifest(self, directory: Path) -> Manifest | None:
        """``directory``'s manifest, read once (raises as ``read_manifest`` does, each time)."""
        if directory not in self._manifests:
            try:
                self._manifests[directory] = read_manifest(directory) if directory.is_dir() \
                    else None
            except DoctorError as err:
                self._manifests[directory] = err
        held = self._manifests[directory]
        if isinstance(held, DoctorError):
            raise held
        return held

    def _manifest_or_none(self, directory: Path) -> Manifest | None:
        try:
            return self.manifest(directory)
        except DoctorError:
            return None

    def evidence(self, directory: Path) -> Evidence:
        """What the live watchdog kept in ``directory``, read once (capture/evidence.py)."""
        if directory not in self._evidence:
            self._evidence[directory] = (read_evidence(directory) if directory.is_dir()
                                         else Evidence())
        return self._evidence[directory]

    def contents(self, directory: Path) -> tuple[Manifest | None, list[Path], list[str]]:
        """(manifest, capture files, notes) of ``directory`` (assemble.contents), once."""
        if directory not in self._contents:
            self._contents[directory] = contents(directory, self.manifest)
        return self._contents[directory]

    def _lead_order(self, path: Path) -> tuple[int, int]:
        manifest = self._manifest_or_none(path)
        node = (manifest.extra.get("node") if manifest is not None else None) or {}
        rank = node.get("node_rank") if isinstance(node, dict) else None
        leader = isinstance(node, dict) and node.get("role") == "leader"
        return (0 if leader else 1, rank if isinstance(rank, int) else 1 << 30)

    # -- the captures ---------------------------------------------------------------------------
    def scan(self, path: Path) -> Read | DoctorError:
        """One capture's records as columns (held when ``hold_columns``, while they are few),
        or why not."""
        made = self.fresh(path)
        self.hold(path, made)
        return made

    def fresh(self, path: Path) -> Read | DoctorError:
        """One capture's records as columns, as held or else read (and not held: safe in a
        reading thread; ``hold`` it after), or why not."""
        held = self._scans.get(path)
        if held is not None:
            return held
        try:
            return self._read(path)
        except DoctorError as err:
            return err

    def hold(self, path: Path, made: Read | DoctorError) -> None:
        """Keep ``made`` (``hold_columns``) while the records held stay within window.above."""
        if not self.hold_columns or path in self._scans:
            return
        if not isinstance(made, DoctorError):
            self._held_rows += _rows(made)
            if self._held_rows > self.window.above:  # a large job: held by no one twice
                self._scans = {p: s for p, s in self._scans.items()
                               if isinstance(s, DoctorError)}
                return
        self._scans[path] = made

    def held_scan(self, path: Path) -> Read | None:
        """The capture's columns if this set holds them (else None: read them with ``scan``)."""
        held = self._scans.get(path)
        return held if held is not None and not isinstance(held, DoctorError) else None

    def chosen(self) -> dict[int, Path]:
        """rank -> its capture: the newest of each rank across every directory (a restarted
        rank's latest), picked once. A capture that cannot be read is not chosen."""
        return self._pick()[0]

    def _pick(self, scans: dict[Path, _First | DoctorError] | None = None
              ) -> tuple[dict[int, Path], dict[int, RankMeta], list[_Pair]]:
        """(rank -> its newest capture, rank -> that capture's metadata, (older, newer) for each
        capture passed over), from the scans made or else the headers."""
        if self._chosen is None:
            found, _ = of_attempt(self._metas(scans or {}), lambda f: f[1].attempt,
                                  self._attempt_read(scans or {}))
            newest, passed = newest_per_rank(found, lambda f: (f[1].rank, f[1].started_ns))
            self._chosen = ({r: f for r, (f, _) in sorted(newest.items())},
                            {r: m for r, (_, m) in sorted(newest.items())},
                            passed)
        return self._chosen

    def _metas(self, scans: dict[Path, _First | DoctorError]) -> list[tuple[Path, RankMeta]]:
        """Every readable capture of every attempt, with its metadata (from ``scans`` where
        they were read, else from their headers; kept once the captures were read)."""
        if not scans and self._found is not None:
            return self._found
        found = []
        for d in self.capture_dirs:
            for f in self.contents(d)[1]:
                meta = self._meta(f, scans)
                if meta is not None:
                    found.append((f, meta))
        if scans:
            self._found = found
        return found

    def _other_attempts(self) -> set[Path]:
        """The captures of attempts other than the one read (from their headers)."""
        chosen = self._attempt_read({})
        return {f for f, meta in self._metas({}) if meta.attempt != chosen}

    def _attempt_read(self, scans: dict[Path, _First | DoctorError]) -> Attempt:
        """The launch attempt read: the one asked for, else the latest any rank began (the
        captures' attempts from ``scans`` where they were read, else from their headers)."""
        if self.attempt is None:
            self.attempt = max(self.attempts(scans), default=(0, 0))
        return self.attempt

    def attempts(self, scans: dict[Path, _First | DoctorError] | None = None
                 ) -> dict[Attempt, int | None]:
        """The launch attempts these captures come from, the first first (one, for a job that
        was never restarted), each with when it began (ns since the epoch): its first rank's
        start, or - its ranks made no capture - its first record of a rank joining or raising
        before it; None where none says."""
        starts: dict[Attempt, int | None] = {}
        for _, meta in self._metas(scans or {}):
            held = starts.get(meta.attempt)
            starts[meta.attempt] = meta.started_ns if held is None else min(held, meta.started_ns)
        marked: dict[Attempt, int | None] = {}
        for d in self.capture_dirs:
            for key, at in (joining.launches_begun(d) if d.is_dir() else {}).items():
                marked[key] = early_exit.earliest(marked.get(key), at)
        for key, at in marked.items():
            if starts.get(key) is None:
                starts[key] = at
        return dict(sorted(starts.items()))

    def _meta(self, path: Path, scans: dict[Path, _First | DoctorError]) -> RankMeta | None:
        scan = scans.get(path) or self._scans.get(path)
        if isinstance(scan, DoctorError):
            return None
        if scan is not None:
            return scan.meta
        if path not in self._headers:
            try:
                self._headers[path] = _meta(read_counters(path)[0])
            except (DoctorError, KeyError, TypeError, ValueError):
                self._headers[path] = None
        return self._headers[path]

    # -- the job as traces ----------------------------------------------------------------------
    def traces(self, settle: Settle = as_recorded) -> TraceSet:
        """The job as one ``TraceSet``: each directory's captures, evidence and samples, each
        rank's end decided by ``settle`` from what its directory says of the job's end, the
        directories' union, and the ``fr`` dumps merged. Made once per ``settle``."""
        made = self._traces.get(settle)
        if made is None:
            made = self._traces[settle] = self._make(settle)
        return made

    def _make(self, settle: Settle) -> TraceSet:
        scans = self._read_all()
        chosen, metas, passed = self._pick(scans)
        world = max([*(m.world_size or 0 for m in self._manifests_here()),
                     *(m.world_size for m in metas.values())], default=0)
        # only some nodes' captures are here: a member with no record may be on another
        partial = len(chosen) < world and any(isinstance(m.extra.get("node"), dict)
                                              for m in self._manifests_here())
        keep = _rows_seen([scans[f] for f in chosen.values()], partial, self.window)
        self._window = keep
        parts, told = [], False
        for d in self.directories:
            if self.is_dumps(d):
                parts.append(fr_dump.traces_from_dumps(fr_parallel.load_window(d), str(d)))
                continue
            here = [passed_over(old, new) for old, new in passed
                    if old[0].parent == new[0].parent == d]
            # the window's note, once: with the first directory it cut
            cut = not told and any(f in keep.masks for f in self.contents(d)[1])
            told |= cut
            parts.append(self._part(d, scans, set(chosen.values()), keep.masks,
                                    here + list(keep.notes if cut else ()), settle))
        if self.directories == list(self.paths[:1]) and len(self.paths) == 1:
            traces = parts[0]
        else:
            traces = union(parts, source=", ".join(str(p) for p in self.paths))
            across = [passed_over(old, new) for old, new in passed
                      if old[0].parent != new[0].parent]
            traces = replace(traces, problems=(*traces.problems, *across))
        return traces if self.fr is None else _with_fr(traces, self.fr, traces.source)

    def _manifests_here(self) -> list[Manifest]:
        return [m for d in self.capture_dirs for m in (self._manifest_or_none(d),)
                if m is not None]

    def _read_all(self) -> dict[Path, _First | DoctorError]:
        """Every capture of every directory read once and outlined for the window (told to
        replay's progress bar): held whole while the records read stay within window.above,
        else let go (``_First.whole``)."""
        # an earlier attempt asked for: its captures alone (told by their headers); else every
        # capture, each read once, the latest attempt's chosen from what was read (``_pick``)
        others = self._other_attempts() if self.attempt is not None else set()
        files = [f for d in self.capture_dirs if d.exists() for f in self.contents(d)[1]
                 if f not in others]
        told = _PROGRESS.get()
        out: dict[Path, _First | DoctorError] = {}
        total, over = 0, False
        work = [(f, self._scans.get(f)) for f in files]
        for (f, held), made in zip(work, ahead(self._first, work,
                                               WORKERS if self._rereads else 1)):
            out[f] = made
            if not isinstance(made, DoctorError):
                if held is None and made.whole:
                    self.hold(f, made.capture)
                total += made.outline.n
                if over:
                    out[f] = made.let_go()
                elif total > self.window.above:  # past the window: every capture's rows go
                    over = self._past = self._rereads
                    out = {p: r if isinstance(r, DoctorError) else r.let_go()
                           for p, r in out.items()}
            if told is not None:
                told(len(out), len(files))
        return out

    def _first(self, job: tuple[Path, Read | DoctorError | None]) -> _First | DoctorError:
        """One capture read (``held``: as this set holds it) and outlined (in a reading
        thread: nothing shared is touched)."""
        path, held = job
        made = held
        past = held is None and self._past  # (read past the window: what its outline needs)
        if made is None:
            try:
                made = read_file(path, window.FIELDS) if past else self._read(path)
            except DoctorError as err:
                return err
        if isinstance(made, DoctorError):
            return made
        first = _First(made, _outline(made))
        return first.let_go() if past else first

    def _trace(self, first: _First, mask: np.ndarray | None) -> RankTrace | DoctorError:
        """The rank's trace: every record, or those ``mask`` keeps (a window) - from the rows
        held, or read again from their slots."""
        capture, rank = first.capture, first.outline
        if isinstance(capture, Scan):  # (a follower's rows: held, never read again)
            return capture.trace(mask)
        at = np.arange(rank.n) if mask is None else np.flatnonzero(mask)
        if first.whole:
            got = capture.rows(at), capture.exited[at], capture.slots[at]
        else:
            again = _reread(capture, rank, at)
            if again is None:  # the capture changed since it was read: read afresh
                try:
                    made = self._read(capture.path)
                except DoctorError as err:
                    return err
                fresh = _First(made, _outline(made))
                win = self._window
                return self._trace(fresh, None if mask is None else window.keep(
                    fresh.outline, win.points, win.tail))
            got = again
        rows, exited, slots = got
        trace = Scan(capture.path, capture.meta, capture.strings, capture.notes,
                     records.Decoded(rows, exited, slots, capture.torn_slots),
                     capture.integrity, capture.exit, capture.paths).trace()
        if mask is None:
            return trace
        return replace(trace, recorded=rank.n, p2p_whole=window.p2p_kept(rank, mask))

    def _part(self, d: Path, scans: dict[Path, _First | DoctorError], chosen: set[Path],
              masks: dict[Path, np.ndarray], notes: list[str], settle: Settle) -> TraceSet:
        """One capture directory (or file) as a ``TraceSet``, its ranks' ends settled: the
        chosen captures' traces (``masks``: the rows of a window), ``notes`` said."""
        manifest, files, damage = self.contents(d)
        read: list[RankTrace | DoctorError | None] = []
        for f in files:
            scan = scans.get(f)  # (None: another launch attempt's, not read)
            read.append(scan if isinstance(scan, DoctorError) else
                        self._trace(scan, masks.get(f)) if f in chosen and scan else None)
        gpu, samples, problems = self._beside.get(d) or beside(d)
        traces = assemble(d, manifest, files, read, gpu, samples, damage + problems, notes,
                          self._attempt_read(scans))
        needs = self.attach or self.replay
        kept = self.evidence(d) if needs and (d.is_dir() or d in self._evidence) else None
        if kept is not None and self.attach:
            traces = with_evidence(traces, kept)
        lost = lifecycle.lost(manifest, kept.watch if kept else None) if self.replay else None
        ended = self.job_ended
        if ended is None:  # a job its reaper stopped: ranks without an exit were stopped
            ended = lost is None and manifest is not None and manifest.ended_at is not None
        stopped = manifest is not None and manifest.exit_status == ExitStatus.HANG_STOPPED
        unknown = stopped and kept is not None and self.attach and kept.watch_damaged
        traces = settle(traces, JobEnd(ended, unknown))
        if not self.replay:
            return traces
        if d.is_file():  # one rank's file: its peers are not here, never "missing"
            return replace(traces, partial=f"{d.name} holds one rank's capture; replay its "
                                           "directory for the whole job")
        why = lifecycle.unfinished(manifest, lost)
        lifecycle.finish(d, manifest, lost)
        return replace(traces, unfinished=why) if why else traces


@dataclass(frozen=True)
class _First:
    """A capture as first read: whole (its records held), or let go of its records but for
    what the window needs (``outline``); read again for the rows the window keeps."""

    capture: Read
    outline: window.Outline
    whole: bool = True

    @property
    def meta(self) -> RankMeta:
        return self.capture.meta

    def let_go(self) -> _First:
        """This capture without its records (a capture read from a file: read again)."""
        capture = self.capture
        if not isinstance(capture, CaptureColumns) or not capture.cols:
            return self
        none = np.zeros(0, dtype=np.int64)
        return _First(replace(capture, cols={}, exited=none.astype(bool), slots=none),
                      self.outline, whole=False)


def read_file(path: Path, fields: tuple[str, ...] = records.FIELDS) -> CaptureColumns:
    """One capture file read whole, its records as columns (reader.read_columns)."""
    return read_columns(path, fields, recent=RECENT)


def _rows(made: Read) -> int:
    return len(made.decoded.rows) if isinstance(made, Scan) else len(made)


def _outline(made: Read) -> window.Outline:
    """The window's outline of one capture's records (its string ids coded by their text)."""
    if isinstance(made, Scan):
        d = made.decoded
        rows, exited, slots = d.rows, d.exited, d.slots
    else:
        rows, exited, slots = made.cols, made.exited, made.slots
    return window.outline(rows, exited, slots, window.codes(made.strings, window.top_id(rows)))


def _reread(capture: CaptureColumns, rank: window.Outline, at: np.ndarray,
            ) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
    """The records at positions ``at`` of a capture read before (``rank``: its outline), read
    again from their slots and checked again: (RECORD rows, exited, slots), or None when they
    are not what the first read found (the capture changed meanwhile)."""
    slots = rank.slots.at(at)
    try:
        fd = os.open(capture.path, os.O_RDONLY)
    except OSError:
        return None
    try:
        runs = np.split(slots, np.flatnonzero(np.diff(slots) != 1) + 1) if len(slots) else []
        parts = [records.read_ring(fd, capture.ring_offset + int(run[0]) * fmt.RECORD_SIZE,
                                   int(run[0]), len(run), capture.capacity) for run in runs]
    except OSError:
        return None
    finally:
        os.close(fd)
    cols = {name: np.concatenate([p.cols[name] for p in parts]) if parts
            else np.zeros(0, dtype=records.RECORD.fields[name][0]) for name in records.FIELDS}
    exited = np.concatenate([p.exited for p in parts]) if parts else np.zeros(0, dtype=bool)
    if (len(exited) != len(at) or not np.array_equal(cols["idx"].astype(np.int64),
                                                     rank.idx.at(at))
            or not np.array_equal(exited, rank.exited_at(at))):
        return None
    rows = np.zeros(len(at), dtype=records.RECORD)
    for name, col in cols.items():
        rows[name] = col
    return rows, exited, slots


T = TypeVar("T")
R = TypeVar("R")


def ahead(work: Callable[[T], R], items: Iterable[T], workers: int = WORKERS) -> Iterator[R]:
    """``work`` of each of ``items``, in order, done by ``workers`` threads a few items ahead of
    the consumer: memory holds a few results at a time, never all."""
    items = list(items)
    if workers <= 1 or len(items) <= 1:
        yield from (work(i) for i in items)
        return
    with ThreadPoolExecutor(workers, thread_name_prefix="nccl-doctor-read") as pool:
        pending: deque[Future[R]] = deque()
        todo = iter(items)
        for item in todo:
            pending.append(pool.submit(work, item))
            if len(pending) >= 2 * workers:
                break
        while pending:
            done = pending.popleft().result()
            nxt = next(todo, None)
            if nxt is not None:
                pending.append(pool.submit(work, nxt))
            yield done


@dataclass(frozen=True)
class _Window:
    masks: dict[Path, np.ndarray]  # capture -> bool per row: the rows the passes see
    notes: tuple[str, ...] = ()
    points: dict[int, list[int]] | None = None  # (what made them: a capture read afresh)
    tail: int = 0


def _rows_seen(scans: Sequence[_First | DoctorError], partial: bool,
               size: window.Size) -> _Window:
    """Each chosen capture's rows the passes see: every record, or - past ``size.above``
    records in all - the window they need (capture/window.py), and a note saying so."""
    good = [s for s in scans if isinstance(s, _First)]
    total = sum(s.outline.n for s in good)
    if total <= size.above:
        return _Window({})
    names = {text for s in good for text in s.capture.strings.values()}
    groups = groups_from_notes([s.capture for s in good])
    members = {window.code(name): g.ranks for name, g in groups.items() if name in names}
    points = window.focus({s.meta.rank: s.outline.leaves for s in good}, members, partial)
    tail = size.per_rank(len(good))
    masks = {s.capture.path: window.keep(s.outline, points, tail) for s in good}
    kept = sum(int(m.sum()) for m in masks.values())
    return _Window(masks, (f"{total} records compared across the ranks with numpy; {kept} "
                           f"analysed call by call: each rank's newest {tail} and those around "
                           "each process group's first divergence and its slowest member's "
                           "last call",), points, tail)


def passed_over(older: tuple[Path, RankMeta], newer: tuple[Path, RankMeta]) -> str:
    """What replay says of a rank's older capture it passed over."""
    (old, _), (new, nm) = older, newer
    if old.parent == new.parent:
        return (f"rank {nm.rank} has several captures (a restarted job?): using {new.name}, "
                f"ignoring {old.name}")
    where = [f"{m.host}:{p.name}" if m.host else p.name for p, m in (older, newer)]
    return (f"rank {nm.rank} has captures on two nodes ({where[0]} and {where[1]}): using the "
            f"newer, {where[1]}")


def _with_fr(traces: TraceSet, fr: Path, where: str) -> TraceSet:
    """``traces`` with the Flight Recorder dumps under ``fr`` merged in by (process group,
    sequence number); dumps of ranks with no capture in ``where`` are named, not merged."""
    dumps = fr_dump.load_dumps(fr)
    problems = list(traces.problems) + list(dumps.problems) + list(dumps.notes)
    unknown = sorted(set(dumps.by_rank) - set(traces.ranks))
    if unknown:
        problems.append(f"Flight Recorder dumps of rank(s) {', '.join(map(str, unknown))} have "
                        f"no capture in {where}: not merged")
    merged = flight_recorder.merge(traces, dumps.by_rank)
    return replace(merged, problems=tuple(problems))
