"""A job its launcher restarted: each earlier launch attempt diagnosed apart from the last.

torchrun's ``--max-restarts`` (TorchElastic) and a Slurm requeue start the job's ranks again.
Every rank of every attempt leaves a capture of its own, marked with its attempt
(``model.RankMeta.attempt``: the requeue and restart counts its launcher set), and the
verdict is the last attempt's: the captures read for it are that attempt's alone
(``capture/union.py`` ``of_attempt``). Each earlier attempt is read as a job of its own, over,
and analysed as any job is; what ended it - its root cause, with the rank, the error, the line
and the branch a finding has - is kept in the report as a finding marked with its attempt, and
every attempt is listed (``Diagnosis.attempts``). The failure that cost a restart is what a
team running with restarts on wants explained.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Callable, Sequence

from nccl_doctor.capture.capture_set import CaptureSet
from nccl_doctor.capture.union import Attempt as AttemptKey
from nccl_doctor.diagnosis import Diagnosis, Finding, Verdict
from nccl_doctor.model import TraceSet
from nccl_doctor.sections import Attempt
from nccl_doctor.watch_log import WatchLog


def with_attempts(diagnosis: Diagnosis, captures: CaptureSet | Sequence[Path],
                  analyze: Callable[[TraceSet], Diagnosis]) -> Diagnosis:
    """``diagnosis`` (the last attempt's) with the job's earlier attempts, read from
    ``captures`` (the set the diagnosis was made from, or its paths) and each diagnosed by
    ``analyze``; itself where there were none."""
    from nccl_doctor.analysis.calls.loaded import loaded

    if not isinstance(captures, CaptureSet):
        captures = CaptureSet(*captures, replay=False, evidence=False)
    paths, starts = captures.paths, captures.attempts()
    keys = list(starts)
    if len(keys) < 2:
        return diagnosis
    attempts, findings, failed = [], [], []
    for number, key in enumerate(keys[:-1], 1):
        captures = CaptureSet(*paths, attempt=key, job_ended=True, replay=False)
        earlier = analyze(_over(loaded(captures), starts[key], starts[keys[number]]))
        attempts.append(_attempt(number, key, starts[key], earlier))
        root = earlier.root_cause
        if root is not None:
            findings.append(_of_attempt(root, number))
        if earlier.verdict is not Verdict.OK:
            failed.append(f"attempt {number} ({attempts[-1].summary})")
    last = _attempt(len(keys), keys[-1], starts[keys[-1]], diagnosis)
    attempts.append(last)
    note = (f"the job was launched {len(keys)} times (its launcher restarted it): this report's "
            f"verdict and ranks are {last.label}'s; "
            + (f"{'; '.join(failed)} ended before it" if failed
               else "the earlier attempts ended with no problem found")
            + ("; their root causes are the findings marked with their attempt"
               if findings else ""))
    return replace(diagnosis, attempts=tuple(attempts),
                   findings=diagnosis.findings + tuple(findings),
                   notes=diagnosis.notes + (note,))


def _over(traces: TraceSet, start_ns: int | None, next_ns: int | None) -> TraceSet:
    """An earlier attempt's job as it was when its launcher ended it (``start_ns``: its first
    rank's start, ``next_ns``: the next attempt's; None: not known): what the directory says of
    the run's end (its exit status, the GPU and the stacks sampled) is the last attempt's, and
    of the watchdog's record only what it decided between the two is this attempt's (a hang
    it called before ``--on-hang restart`` ended these ranks)."""
    watch = traces.watch
    if watch is not None:
        kept = tuple(e for e in watch.events
                     if (start_ns is None or e.at * 1e9 >= start_ns)
                     and (next_ns is None or e.at * 1e9 < next_ns))
        watch = WatchLog(kept) if kept else None
    return replace(traces, exit_status=None, watch=watch, stacks={}, gpu=None,
                   stack_samples=(), unfinished="")


def _attempt(number: int, key: AttemptKey, started_ns: int | None, d: Diagnosis) -> Attempt:
    root = d.root_cause
    summary = root.title if root is not None else "no problem found"
    if root is None and d.verdict is Verdict.INTERRUPTED:  # its first note says by what
        summary = next((n.split(": the ranks'", 1)[0] for n in d.notes
                        if n.startswith("interrupted by")), "interrupted")
    return Attempt(number=number, restart=key[1], requeue=key[0],
                   ranks=tuple(r.rank for r in d.ranks), verdict=d.verdict.value,
                   summary=summary, started_ns=started_ns)


def _of_attempt(finding: Finding, number: int) -> Finding:
    """An earlier attempt's root cause, as a finding of the job's report."""
    return replace(finding, root_cause=False, attempt=number,
                   title=f"attempt {number}: {finding.title}")
