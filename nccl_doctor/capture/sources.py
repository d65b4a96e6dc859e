"""What ``replay`` reads: a capture directory (or one capture file), a directory of PyTorch
Flight Recorder dumps, or both merged (a capture plus the job's own dumps)."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from nccl_doctor.capture import flight_recorder, fr_dump, fr_parallel
from nccl_doctor.capture import format as fmt
from nccl_doctor.capture.directory import MANIFEST, load_capture_dir
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
        traces = load_capture_dir(path)  # says what is wrong with anything else
    if fr is None:
        return traces
    dumps = fr_dump.load_dumps(fr)
    problems = list(traces.problems) + list(dumps.problems) + list(dumps.notes)
    unknown = sorted(set(dumps.by_rank) - set(traces.ranks))
    if unknown:
        problems.append(f"Flight Recorder dumps of rank(s) {', '.join(map(str, unknown))} have "
                        f"no capture in {path}: not merged")
    merged = flight_recorder.merge(traces, dumps.by_rank)
    return replace(merged, problems=tuple(problems))
