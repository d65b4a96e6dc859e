"""A capture directory: ``manifest.json``, one capture file per rank process, and the evidence the
supervisor gathered beside them (``gpu.jsonl``: nccl_doctor/gpu/series.py; ``stragglers.jsonl``:
nccl_doctor/stacks/samples.py), and ``report.json``.

This module owns the directory's file names (``OWN_FILES``). ``load_capture_dir`` turns it into
a ``TraceSet``; ``Manifest`` and ``write_report`` are the supervisor's to write.
"""

from __future__ import annotations

import json
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any, Callable, Iterator

from nccl_doctor import redact
from nccl_doctor._version import __version__
from nccl_doctor.capture import flight_recorder, fr_dump, watch_record
from nccl_doctor.capture import format as fmt
from nccl_doctor.capture import window
from nccl_doctor.capture.follow import CaptureFollower, Scan, scan_capture
from nccl_doctor.capture.unrecorded import read_unrecorded
from nccl_doctor.errors import (
    CaptureNotFound, CorruptCapture, DoctorError, NotACapture, UnsupportedVersion,
)
from nccl_doctor.diagnosis import Diagnosis
from nccl_doctor.files import write_atomic
from nccl_doctor.gpu.readings import GpuTrace
from nccl_doctor.gpu.series import GPU_JSONL, read_gpu
from nccl_doctor.stacks.samples import STRAGGLERS_JSONL, StackSample, read_samples
from nccl_doctor.model import ExitKind, GroupInfo, RankExit, RankTrace, TraceSet, Unrecorded

MANIFEST = "manifest.json"
MANIFEST_FORMAT = "nccl-doctor-capture"
REPORT_JSON = "report.json"
REPORT_HTML = "report.html"  # the same diagnosis as a page (nccl_doctor/reporters/html.py)
#: Every name nccl-doctor writes into a capture directory (an --out holding only these is ours).
OWN_FILES = (f"*{fmt.CAPTURE_SUFFIX}", f"*{fmt.FAULT_SUFFIX}", f"*{fmt.UNRECORDED_SUFFIX}",
             MANIFEST, REPORT_JSON, REPORT_HTML, GPU_JSONL,
             STRAGGLERS_JSONL, watch_record.WATCH_JSON, watch_record.STACKS_JSON,
             f"{watch_record.FR_DIR}/rank_*.json")


def remove_own_files(directory: Path) -> None:
    """Delete what an earlier run wrote into ``directory`` (never any other file)."""
    for pattern in OWN_FILES:
        for path in directory.glob(pattern):
            if path.is_symlink() or not path.is_dir():  # a directory of that name is not ours
                path.unlink()
    folder = directory / watch_record.FR_DIR
    if folder.is_dir() and not any(folder.iterdir()):
        folder.rmdir()


def report_path(directory: Path) -> Path:
    return directory / REPORT_JSON


def write_report(directory: Path, diagnosis: Diagnosis) -> Path:
    """``report.json`` (the schema in README.md), written atomically: a reader never sees half
    a report."""
    path = report_path(directory)
    write_atomic(path, diagnosis.to_json_text())
    return path


@dataclass(frozen=True)
class Manifest:
    command: tuple[str, ...]  # as launched; written with its secrets masked unless not redacted
    started_at: float
    run_id: str
    format: str = MANIFEST_FORMAT
    format_version: int = fmt.FORMAT_VERSION
    tool_version: str = __version__
    ended_at: float | None = None
    exit_status: int | None = None
    world_size: int | None = None
    hosts: tuple[str, ...] = ()
    captures: tuple[str, ...] = ()
    extra: dict[str, Any] = field(default_factory=dict)
    # False: `nccl-doctor run --no-redact` stored the command verbatim (nccl_doctor/redact.py).
    # The supervisor that builds this says so through NO_REDACT, like the ranks it launches.
    redacted: bool = True  # False: `run --no-redact` (redact.wanted of the job's environment)

    def to_json(self) -> dict[str, Any]:
        d = asdict(self)
        # every writer (the supervisor, a replay finishing a lost run's manifest) masks it here
        d["command"] = redact.argv(self.command) if self.redacted else list(self.command)
        d["hosts"], d["captures"] = list(self.hosts), list(self.captures)
        return d

    def write(self, directory: Path) -> Path:
        path = directory / MANIFEST
        write_atomic(path, json.dumps(self.to_json(), indent=2, sort_keys=True) + "\n")
        return path


class DamagedManifest(CorruptCapture):
    """``manifest.json`` is ours but cannot be read (not JSON, fields of the wrong type). The
    loaders go on without it from the captures that read fine."""

    def __init__(self, path: Path, why: str) -> None:
        super().__init__(f"{path} is damaged ({why})")
        self.why = why


def read_manifest(directory: Path) -> Manifest | None:
    """The manifest of ``directory`` (None: it has none). Raises ``NotACapture`` for another
    tool's JSON, ``UnsupportedVersion``, and ``DamagedManifest``."""
    path = directory / MANIFEST
    if not path.is_file():
        return None
    try:
        raw = json.loads(path.read_text("utf-8"))
    except OSError as err:
        raise DamagedManifest(path, f"unreadable: {err.strerror}") from None
    except ValueError as err:  # (a UnicodeDecodeError too)
        raise DamagedManifest(path, f"not valid JSON: {err}") from None
    if not isinstance(raw, dict) or raw.get("format") != MANIFEST_FORMAT:
        raise NotACapture(f"{path} is not an nccl-doctor manifest (no \"format\": \"{MANIFEST_FORMAT}\")")
    version = raw.get("format_version")
    if version not in fmt.READABLE_VERSIONS:
        raise UnsupportedVersion(
            f"{path} is capture format version {version}, this nccl-doctor reads versions "
            f"{fmt.readable_versions()}: replay it with the nccl-doctor release that recorded it"
        )
    try:
        redacted = _typed(raw, "redacted", bool, True)
        command = _strings(raw, "command")
        return Manifest(
            # (older manifests stored it verbatim: masked on reading, for the report)
            command=tuple(redact.argv(command) if redacted else command),
            started_at=float(_typed(raw, "started_at", _NUMBER, 0.0)),
            run_id=_typed(raw, "run_id", str, ""),
            tool_version=_typed(raw, "tool_version", str, ""),
            ended_at=_typed(raw, "ended_at", _NUMBER, None),
            exit_status=_typed(raw, "exit_status", int, None),
            world_size=_typed(raw, "world_size", int, None),
            hosts=tuple(_strings(raw, "hosts")), captures=tuple(_strings(raw, "captures")),
            extra=dict(_typed(raw, "extra", dict, {})), redacted=redacted,
        )
    except (TypeError, ValueError) as err:
        raise DamagedManifest(path, str(err)) from None


_NUMBER = (int, float)


def _typed(raw: dict[str, Any], name: str, kind: Any, default: Any) -> Any:
    """``raw[name]`` if it is a ``kind`` (or None where ``default`` is: optional), ``default``
    when absent; a wrong type raises TypeError. (bool is an int to Python, never to us.)"""
    if name not in raw or (raw[name] is None and default is None):
        return default
    value = raw[name]
    if not isinstance(value, kind) or (isinstance(value, bool) and kind is not bool):
        raise TypeError(f"its {name!r} is {type(value).__name__} {json.dumps(value)[:40]}")
    return value


def _strings(raw: dict[str, Any], name: str) -> list[str]:
    value = _typed(raw, name, list, [])
    if not all(isinstance(v, str) for v in value):
        raise TypeError(f"its {name!r} holds non-strings")
    return value


def capture_files(directory: Path) -> list[Path]:
    return sorted(directory.glob(f"*{fmt.CAPTURE_SUFFIX}"))


#: Told (captures read, captures in all) as load_capture_dir reads (replay's progress bar).
_PROGRESS: ContextVar[Callable[[int, int], None] | None] = ContextVar("nccl_doctor_reading",
                                                                     default=None)


@contextmanager
def reading_progress(told: Callable[[int, int], None]) -> Iterator[None]:
    """Within this block every ``load_capture_dir`` tells ``told`` how far it has read."""
    token = _PROGRESS.set(told)
    try:
        yield
    finally:
        _PROGRESS.reset(token)


def load_capture_dir(path: Path, *, job_ended: bool | None = None,
                     evidence: bool = True, window_above: int | None = None) -> TraceSet:
    """Load every rank's capture under ``path`` (a directory, or one ``.ndcap`` file).

    ``job_ended`` says whether the job is over (ranks with no exit record then count as vanished);
    by default the manifest's ``ended_at`` decides. ``evidence``: also what the live watchdog
    kept (nccl_doctor/capture/watch_record.py): its Flight Recorder pulls are merged, its
    decisions and stacks attached, and the ranks it stopped marked so. ``window_above``: how many
    records in all make the passes see a window of them (default ``WINDOW_ABOVE``).
    """
    manifest, files, damage = _contents(path)
    if job_ended is None:
        job_ended = manifest is not None and manifest.ended_at is not None
    told = _PROGRESS.get()
    scans = []
    for f in files:
        scans.append(_try(scan_capture, f))
        if told is not None:
            told(len(scans), len(files))
    read, note = _events(scans, manifest, window_above)
    gpu, samples, problems = _beside(path)
    loaded = _assemble(path, manifest, files, read, job_ended, gpu, samples,
                       damage + problems + note)
    return _with_evidence(loaded, path) if evidence and path.is_dir() else loaded


#: Records above which a replay analyses a window of them (capture/window.py), not all.
WINDOW_ABOVE = 100_000
#: The newest records of each rank analysed in a window: this many in all, shared by the ranks,
#: and at least ``TAIL`` each.
WINDOW_TAILS = 32_768
TAIL = 64


def _events(scans: list[Scan | DoctorError], manifest: Manifest | None,
            above: int | None = None) -> tuple[list[RankTrace | DoctorError], list[str]]:
    """Each capture's trace: with every record, or - past ``above`` records in all - with the
    window the passes need (capture/window.py), and a note saying so."""
    above = WINDOW_ABOVE if above is None else above
    good = [s for s in scans if isinstance(s, Scan)]
    total = sum(len(s.decoded.rows) for s in good)
    if total <= above:
        return [s if isinstance(s, DoctorError) else s.trace() for s in scans], []
    table: dict[str, int] = {}
    latest: dict[int, Scan] = {}
    for scan in good:
        held = latest.get(scan.meta.rank)
        if held is None or held.meta.started_ns <= scan.meta.started_ns:
            latest[scan.meta.rank] = scan
    lv = {id(s): window.leaves(s.decoded.rows, s.decoded.exited,
                               window.codes(s.strings, table, s.decoded.rows)) for s in good}
    groups = groups_from_notes(latest.values())
    members = {table[name]: g.ranks for name, g in groups.items() if name in table}
    world = max([s.meta.world_size for s in good] + [manifest.world_size or 0 if manifest else 0])
    node = manifest.extra.get("node") if manifest is not None else None
    partial = isinstance(node, dict) and len(latest) < world
    points = window.focus({r: lv[id(s)] for r, s in latest.items()}, members, partial)
    tail = max(TAIL, WINDOW_TAILS // max(1, len(good)))
    out: list[RankTrace | DoctorError] = []
    kept = 0
    for scan in scans:
        if isinstance(scan, DoctorError):
            out.append(scan)
            continue
        mask = window.keep(scan.decoded.rows, lv[id(scan)], points, tail)
        kept += int(mask.sum())
        out.append(scan.trace(mask))
    return out, [f"{total} records compared across the ranks with numpy; {kept} analysed call "
                 f"by call: each rank's newest {tail} and those around each process group's "
                 "first divergence and its slowest member's last call"]


class LiveCaptures:
    """The captures of a running job, followed (capture/follow.py): ``load()`` costs the records
    written since the previous one, and returns the previous ``TraceSet`` itself when nothing
    changed - the watches and the silent checks all share it, and may cache on its identity."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self._followers: dict[Path, CaptureFollower] = {}
        self._read: list[RankTrace | DoctorError] = []
        self._beside: tuple[tuple, tuple] = ((), ())  # (stamps, what) of gpu.jsonl & stragglers
        self._cut: dict[int, tuple[RankTrace, RankTrace]] = {}  # id -> (trace, its newest part)
        self._last: TraceSet | None = None

    def load(self) -> TraceSet:
        """The job as its captures show it now (ranks still running: no exit yet)."""
        manifest, files, damage = _contents(self.directory)
        read = [self._follow(f) for f in files]
        stamps = tuple(_stamp(self.directory / name) for name in (GPU_JSONL, STRAGGLERS_JSONL))
        # a rank that could not make its capture is news too, though no capture moved
        stamps += tuple((p.name, _stamp(p))
                        for p in sorted(self.directory.glob(f"*{fmt.UNRECORDED_SUFFIX}")))
        moved = stamps != self._beside[0]
        if moved:
            self._beside = (stamps, _beside(self.directory))
        same = len(read) == len(self._read) and all(a is b for a, b in zip(read, self._read))
        if same and not moved and self._last is not None:
            return self._last
        self._read = read
        gpu, samples, problems = self._beside[1]
        self._last = _assemble(self.directory, manifest, files, self._tails(read), False, gpu,
                               samples, damage + problems)
        return self._last

    def _tails(self, read: list[RankTrace | DoctorError]) -> list[RankTrace | DoctorError]:
        """Past ``WINDOW_ABOVE`` records in all, each rank's newest ones only (``WINDOW_TAILS``
        shared, at least ``TAIL`` each): a look at a running job is about how it stands now,
        and full rings would make each look's analysis cost seconds. (A replay, and the
        supervisor's own post mortem, read the whole window: ``load_capture_dir``.)"""
        traces = [t for t in read if isinstance(t, RankTrace)]
        if sum(len(t.events) for t in traces) <= WINDOW_ABOVE:
            return read
        tail = max(TAIL, WINDOW_TAILS // max(1, len(traces)))
        cut = {}
        for t in traces:
            held = self._cut.get(id(t))
            cut[id(t)] = held if held is not None and held[0] is t else (
                t, replace(t, events=t.events[-tail:], recorded=t.records))
        self._cut = cut
        return [cut[id(t)][1] if isinstance(t, RankTrace) else t for t in read]

    def _follow(self, path: Path) -> RankTrace | DoctorError:
        follower = self._followers.get(path)
        try:
            if follower is None:  # (a file being created may not be readable yet: next time)
                follower = self._followers[path] = CaptureFollower(path)
            return follower.read()
        except DoctorError as err:
            return err

    def close(self) -> None:
        for follower in self._followers.values():
            follower.close()
        self._followers.clear()


def _stamp(path: Path) -> tuple[int, int] | None:
    try:
        st = path.stat()
    except OSError:
        return None
    return st.st_size, st.st_mtime_ns


def _try(read: Callable[[Path], Scan], path: Path) -> Scan | DoctorError:
    try:
        return read(path)
    except DoctorError as err:
        return err


def _contents(path: Path) -> tuple[Manifest | None, list[Path], list[str]]:
    """(the manifest, the capture files, notes) of a capture directory or file. A damaged
    manifest beside captures is a note: the captures that read fine are replayed."""
    if not path.exists():
        raise CaptureNotFound(
            f"{path} does not exist: pass the --out directory of an `nccl-doctor run`"
        )
    if path.is_file():
        if path.suffix != fmt.CAPTURE_SUFFIX:
            raise NotACapture(
                f"{path} is not a capture: pass a capture directory or a {fmt.CAPTURE_SUFFIX} file"
            )
        return None, [path], []
    if not any(path.iterdir()):
        raise CaptureNotFound(f"{path} is empty: it holds no capture (was the job ever run?)")
    files = capture_files(path)
    try:
        manifest = read_manifest(path)
    except DamagedManifest as err:
        if not files:
            raise
        # as if there were none (a job that may still run): the captures say the rest
        return None, files, [f"{MANIFEST} is damaged ({err.why}): reconstructed from the "
                             "captures; the command, exit status and end time are unknown"]
    if manifest is None and not files:
        raise NotACapture(
            f"{path} is not an nccl-doctor capture directory "
            f"(no {MANIFEST}, no *{fmt.CAPTURE_SUFFIX} files) nor a directory of PyTorch "
            "Flight Recorder dumps"
        )
    return manifest, files, []


def _beside(path: Path) -> tuple[GpuTrace | None, tuple[StackSample, ...], list[str]]:
    """The GPU samples and the stragglers' stack samples beside the captures."""
    gpu, samples, problems = None, (), []
    if path.is_dir():
        try:
            gpu = read_gpu(path)
        except ValueError as err:
            problems.append(f"GPU samples skipped: {err}")
        samples = read_samples(path)
    return gpu, samples, problems


def _assemble(path: Path, manifest: Manifest | None, files: list[Path],
              read: list[RankTrace | DoctorError], job_ended: bool, gpu: GpuTrace | None,
              samples: tuple[StackSample, ...], beside_problems: list[str]) -> TraceSet:
    """The ``TraceSet`` of what was read from ``files`` (a trace, or why not, for each)."""
    traces: dict[int, RankTrace] = {}
    problems: list[str] = []
    errors: list[DoctorError] = []
    for trace in read:
        if isinstance(trace, DoctorError):
            errors.append(trace)
            problems.append(str(trace))
            continue
        if job_ended and trace.exit.kind is ExitKind.RUNNING:
            trace = replace(trace, exit=RankExit(ExitKind.VANISHED))
        previous = traces.get(trace.rank)
        if previous is not None:
            older, trace = sorted((previous, trace), key=lambda t: t.meta.started_ns)
            problems.append(
                f"rank {trace.rank} has several captures (a restarted job?): using "
                f"{Path(trace.path).name}, ignoring {Path(older.path).name}"
            )
        traces[trace.rank] = trace
    if files and not traces:
        if all(isinstance(e, UnsupportedVersion) for e in errors):
            raise errors[0]
        if len(errors) == 1:
            raise errors[0]
        raise CorruptCapture(
            f"none of the {len(files)} capture files in {path} can be read ({errors[0]})"
        )
    for rank, trace in sorted(traces.items()):
        if not trace.integrity.complete:
            problems.append(
                f"rank {rank}'s capture is incomplete ({trace.integrity.describe()}): "
                "its last events may be missing"
            )
    problems += beside_problems
    markers: dict[int, tuple[Unrecorded, int]] = {}
    if path.is_dir():
        markers, bad = read_unrecorded(path)
        problems += bad
    unrecorded = {r: u for r, (u, _) in sorted(markers.items()) if r not in traces}
    sizes = [t.meta.world_size for t in traces.values()]
    sizes += [markers[r][1] for r in unrecorded]
    if manifest is not None and manifest.world_size:
        sizes.append(manifest.world_size)
    world = max(sizes, default=0)
    node = manifest.extra.get("node") if manifest is not None else None
    partial = ""
    if isinstance(node, dict) and len(traces) < world:
        partial = (f"the captures of host {node.get('host', '?')} only (node "
                   f"{node.get('node_rank', '?')} of a multi-node job; replay every node's "
                   "directory together for the whole job)")
    return TraceSet(
        partial=partial, unrecorded=unrecorded,
        ranks=traces, groups=groups_from_notes(traces.values()), world_size=world,
        command=manifest.command if manifest else (), problems=tuple(problems),
        exit_status=manifest.exit_status if manifest else None, source=str(path), gpu=gpu,
        stack_samples=samples,
    )


def _with_evidence(traces: TraceSet, path: Path) -> TraceSet:
    """``traces`` plus what the live watchdog kept beside them (each file optional; a damaged
    one is a note, never the end of the replay)."""
    problems = list(traces.problems)
    watch, stacks = None, {}
    try:
        watch = watch_record.read_watch_log(path)
    except ValueError as err:
        problems.append(f"the watchdog's record skipped: {err}")
    try:
        stacks = watch_record.read_stacks(path)
    except ValueError as err:
        problems.append(f"the kept stacks skipped: {err}")
    folder = path / watch_record.FR_DIR
    if folder.is_dir() and any(folder.iterdir()):
        try:
            dumps = fr_dump.load_dumps(folder)
            traces = flight_recorder.merge(traces, dumps.by_rank)
            problems.extend(dumps.problems)
        except DoctorError as err:
            problems.append(f"the kept Flight Recorder pulls skipped: {err}")
    ranks = dict(traces.ranks)
    stopped_at = watch.stopped_at if watch is not None else None
    if stopped_at is not None:
        sent = ", then ".join(dict.fromkeys(watch.signals)) if watch else ""
        for rank, trace in ranks.items():
            ex = trace.exit
            if ex.time_ns is not None and ex.time_ns < stopped_at * 1e9:
                continue  # it had ended before the stop: the stop is not its end
            # a clean exit known to follow the stop is its doing too (a script that catches
            # KeyboardInterrupt or SIGTERM, saves, and returns)
            if ex.abnormal or ex.kind is ExitKind.RUNNING or (
                    ex.kind is ExitKind.CLEAN and ex.time_ns is not None):
                ranks[rank] = replace(trace, exit=RankExit(ExitKind.STOPPED, signal=sent or None,
                                                           time_ns=ex.time_ns))
    return replace(traces, ranks=ranks, problems=tuple(problems), watch=watch, stacks=stacks)


def groups_from_notes(traces: Any) -> dict[str, GroupInfo]:
    groups: dict[str, GroupInfo] = {}
    for trace in traces:
        for note in trace.notes:
            if note.get("note") != "group" or not isinstance(note.get("name"), str):
                continue
            ranks, name = note.get("ranks"), note["name"]
            if not isinstance(ranks, list) or (name in groups and
                                               len(ranks) <= len(groups[name].ranks)):
                continue  # (every rank notes the world group: check each layout once)
            if not all(isinstance(r, int) for r in ranks):
                continue
            if name not in groups or len(ranks) > len(groups[name].ranks):
                groups[name] = GroupInfo(
                    name, tuple(ranks), str(note.get("backend", "")), str(note.get("desc", ""))
                )
    return groups
