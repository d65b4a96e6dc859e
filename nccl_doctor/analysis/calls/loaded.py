"""A job's captures as the analysis sees them: read once by capture/capture_set.py, each rank's
end decided here from what its capture directory says of the job's end (ends.py) - the step that
made the capture loader import the analysis, up beside ``analyze``."""

from __future__ import annotations

import time
from dataclasses import replace
from pathlib import Path

from nccl_doctor.analysis.calls.ends import Ending, this_attempts, with_ends_known
from nccl_doctor.capture.capture_set import CaptureSet, JobEnd
from nccl_doctor.capture.window import DEFAULT, Size
from nccl_doctor.model import ExitKind, TraceSet


def settle(traces: TraceSet, end: JobEnd) -> TraceSet:
    """One capture directory's ``traces`` with each rank's end decided: from the watchdog's
    record of the stop, whether the job is over, and a stop whose time was lost. One node's
    directory of a multi-node job whose supervisor was lost (its reaper's record): the node was
    lost to the job, with the ranks it stopped - as the other nodes saw it live. (What the
    record holds of a launcher's earlier attempts is theirs: ``this_attempts``.)"""
    traces = replace(traces, watch=this_attempts(traces.watch, traces))
    lost = traces.watch.lost if traces.watch is not None else None
    gone = {}
    if lost is not None and traces.partial:
        gone = {r: (t.meta.host, int(lost.at * 1e9)) for r, t in traces.ranks.items()
                if t.exit.kind is ExitKind.RUNNING}
    ending = Ending.of(traces.watch, ended=end.ended, lost=gone)
    if end.stop_unknown:
        ending = replace(ending, stop_unknown=True)
    settled = with_ends_known(traces, ending)
    if gone and lost is not None:
        hosts = ", ".join(sorted({host for host, _ in gone.values()}))
        sent = ", then ".join(lost.signals) or "signals"
        when = time.strftime("%H:%M:%S", time.localtime(lost.at))
        settled = replace(settled, problems=settled.problems + (
            f"the supervisor of {hosts} (nccl-doctor run) was lost at ~{when}, before the job "
            f"ended; its reaper stopped that node's ranks ({sent}): the node was lost to the "
            "job then",))
    return settled


def loaded(captures: CaptureSet) -> TraceSet:
    """The job of ``captures`` with every rank's end decided: what replay analyses."""
    return captures.traces(settle)


def load(*paths: Path | str, fr: Path | None = None) -> TraceSet:
    """What ``nccl-doctor replay PATH... [--fr DIR]`` analyses."""
    return loaded(CaptureSet(*paths, fr=fr))


def load_capture_dir(path: Path, *, job_ended: bool | None = None, evidence: bool = True,
                     window: Size = DEFAULT) -> TraceSet:
    """Every rank's capture under ``path`` (a directory, or one ``.ndcap`` file), without what
    replay adds of the run's end (capture/lifecycle.py).

    ``job_ended``: whether the job is over (ranks with no exit record then count as vanished);
    by default the manifest's ``ended_at`` decides. ``evidence``: also what the live watchdog
    kept (its Flight Recorder pulls merged, its decisions and stacks attached, the ranks it
    stopped marked so). ``window``: how many records in all make the passes see a window.
    """
    return loaded(CaptureSet(path, job_ended=job_ended, evidence=evidence, window=window,
                             replay=False))
