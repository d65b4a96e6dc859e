"""What ``replay`` reads: a capture directory (or one capture file), a directory of PyTorch
Flight Recorder dumps, or both merged (a capture plus the job's own dumps); for a job across
several hosts, every node's capture directory (or one directory holding them), as one job."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from nccl_doctor.capture import flight_recorder, fr_dump, fr_parallel, lifecycle
from nccl_doctor.capture import format as fmt
from nccl_doctor.capture.loading import load_capture_dir
from nccl_doctor.capture.manifest import MANIFEST, read_manifest
from nccl_doctor.capture.union import union
from nccl_doctor.errors import DoctorError
from nccl_doctor.model import TraceSet


def is_capture(path: Path) -> bool:
    if path.is_file():
        return path.suffix == fmt.CAPTURE_SUFFIX
    return (path / MANIFEST).is_file() or any(path.glob(f"*{fmt.CAPTURE_SUFFIX}"))


def load(path: Path, fr: Path | None = None) -> TraceSet:
    """The traces at ``path`` (a capture, else Flight Recorder dumps), with the Flight Recorder
    dumps under ``fr`` merged in by (process group, sequence number)."""
    if path.exists() and not is_capture(path) and fr_dump.is_dump_dir(path):
        traces = fr_dump.traces_from_dumps(fr_parallel.load_window(path), str(path))
    else:
        traces = _capture(path)
    return traces if fr is None else _with_fr(traces, fr, str(path))


def _capture(path: Path) -> TraceSet:
    """A capture directory or one capture file; a run whose end is unknown says why."""
    if path.is_file():  # one rank's file: its peers are not here, never "missing"
        traces = load_capture_dir(path)
        return replace(traces, partial=f"{path.name} holds one rank's capture; replay its "
                                       "directory for the whole job")
    try:
        manifest = read_manifest(path) if path.is_dir() else None
    except DoctorError:
        manifest = None  # load_capture_dir says what is wrong with it
    lost = lifecycle.lost(path, manifest)
    # a job its reaper stopped: ranks without an exit record were stopped, not vanished
    traces = load_capture_dir(path, job_ended=False if lost is not None else None)
    why = lifecycle.unfinished(manifest, lost)
    lifecycle.finish(path, manifest, lost)
    return replace(traces, unfinished=why) if why else traces


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


def node_dirs(path: Path) -> list[Path]:
    """The per-node capture directories directly under ``path`` (after an rsync, or on a shared
    filesystem), when ``path`` holds no capture of its own; else []."""
    if not path.is_dir() or is_capture(path):
        return []
    return sorted(d for d in path.iterdir() if d.is_dir() and is_capture(d))


def _lead_order(path: Path) -> tuple[int, int]:
    """The leader's directory first (its watchdog record is the job's), then by node rank."""
    try:
        manifest = read_manifest(path) if path.is_dir() else None
    except DoctorError:
        manifest = None
    node = (manifest.extra.get("node") if manifest is not None else None) or {}
    rank = node.get("node_rank") if isinstance(node, dict) else None
    leader = isinstance(node, dict) and node.get("role") == "leader"
    return (0 if leader else 1, rank if isinstance(rank, int) else 1 << 30)


def load_many(paths: list[Path], fr: Path | None = None) -> TraceSet:
    """One job from ``paths``: a capture, Flight Recorder dumps, several nodes' capture
    directories, or one directory holding those (merged by rank, the leader's record first)."""
    if len(paths) == 1 and not node_dirs(paths[0]):
        return load(paths[0], fr)
    dirs = [d for p in paths for d in (node_dirs(p) or [p])]
    dirs = sorted(dict.fromkeys(dirs), key=_lead_order)  # stable: the order given otherwise
    parts = [load(d) for d in dirs]
    merged = union(parts, source=", ".join(str(p) for p in paths))
    return merged if fr is None else _with_fr(merged, fr, merged.source)
