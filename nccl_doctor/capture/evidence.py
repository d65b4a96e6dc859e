"""What the live watchdog kept beside the captures - its decisions and actions, the stacks and
the Flight Recorder pulls they used - as one value, and that value attached to a ``TraceSet``.

The supervisor holds its ``Evidence`` in memory and hands it over at the end of a run; replay
reads the same from the files (``read_evidence``). Either way ``with_evidence`` makes the same
``TraceSet`` of it (pure).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Mapping

from nccl_doctor.capture import flight_recorder, fr_dump, watch_record
from nccl_doctor.errors import DoctorError
from nccl_doctor.model import TraceSet
from nccl_doctor.stacks.rank_stack import RankStack
from nccl_doctor.watch_log import WatchLog


@dataclass(frozen=True)
class Evidence:
    watch: WatchLog | None = None
    stacks: Mapping[int, RankStack] = field(default_factory=dict)
    # each rank's last Flight Recorder pull (Flight Recorder's JSON form, as kept on disk)
    flight_recorder: Mapping[int, Mapping[str, Any]] = field(default_factory=dict)
    problems: tuple[str, ...] = ()  # kept files that could not be read, and why
    watch_damaged: bool = False  # watchdog.json is there but cannot be read


def read_evidence(path: Path) -> Evidence:
    """The evidence kept in capture directory ``path`` (each file optional; a damaged one is a
    problem noted, never the end of the replay)."""
    problems: list[str] = []
    watch, stacks, dumps, damaged = None, {}, {}, False
    try:
        watch = watch_record.read_watch_log(path)
    except ValueError as err:
        problems.append(f"the watchdog's record skipped: {err}")
        damaged = True
    try:
        stacks = watch_record.read_stacks(path)
    except ValueError as err:
        problems.append(f"the kept stacks skipped: {err}")
    folder = path / watch_record.FR_DIR
    if folder.is_dir() and any(folder.iterdir()):
        try:
            loaded = fr_dump.load_dumps(folder)
            dumps = loaded.by_rank
            problems.extend(loaded.problems)
        except DoctorError as err:
            problems.append(f"the kept Flight Recorder pulls skipped: {err}")
    return Evidence(watch, stacks, dumps, tuple(problems), damaged)


def with_evidence(traces: TraceSet, evidence: Evidence) -> TraceSet:
    """``traces`` with the Flight Recorder pulls merged, the watchdog's record and stacks
    attached (the ranks it stopped are told by analysis/calls/ends.py from the record)."""
    if evidence.flight_recorder:
        traces = flight_recorder.merge(traces, {r: dict(d) for r, d in
                                                evidence.flight_recorder.items()})
    return replace(traces, problems=traces.problems + evidence.problems,
                   watch=evidence.watch, stacks=dict(evidence.stacks))
