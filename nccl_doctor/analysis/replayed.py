"""The live watchdog's verdict, reached again offline from what it kept (``TraceSet.watch``).

A hang the watchdog called and did not retract stands in the replay, with the root finding it
recorded (the evidence of a peer seen stuck over several samples, or of a stall past
--hang-after, exists only in its record); ``watchdog.root_from_captures`` says whether the
analysis of the captures and the kept Flight Recorder pulls names the same divergence by itself
(it does for a desync). What the backend did afterwards (an NCCL abort, a gloo timeout) is added
as such.

A job the user interrupted (Ctrl-C, or a scheduler's SIGTERM forwarded by ``run``) is diagnosed
as it was when the interrupt came: the ranks' ends after it were marked stopped by the loader,
so a stall that made the user press Ctrl-C is the root cause, not the KeyboardInterrupt it
raised; a job that was fine until then is not a crash.
"""

from __future__ import annotations

import time
from dataclasses import replace
from typing import Sequence

from nccl_doctor.analysis import annotate
from nccl_doctor.analysis.hang import hang_diagnosis
from nccl_doctor.diagnosis import Diagnosis, Finding, Severity, Verdict
from nccl_doctor.model import TraceSet


def same_root(a: Finding | None, b: Finding | None) -> bool:
    """Whether two root findings name the same divergence (kind, group, sequence number)."""
    return a is not None and b is not None and (a.kind, a.group, a.seq) == (b.kind, b.group, b.seq)


def with_watch(diagnosis: Diagnosis, traces: TraceSet,
               annotators: Sequence[annotate.Annotator] | None = None) -> Diagnosis:
    """``diagnosis`` as the watchdog left it: unchanged unless a hang it called stands."""
    watch = traces.watch
    hang = watch.hang if watch is not None else None
    if watch is not None and hang is None and watch.interrupted is not None:
        return interrupted(diagnosis, watch.interrupted)
    if watch is None or hang is None:
        return diagnosis
    recorded, own = watch.root, diagnosis.root_cause
    root = recorded or own
    account = dict(hang.get("watchdog") or {})
    # whether the captures alone lead to the same root cause (a desync does; a peer seen stuck
    # over several samples is the watchdog's own evidence)
    account["root_from_captures"] = same_root(own, recorded)
    notes = [str(e.get("what")) for e in watch.after_hang("aftermath") if e.get("what")]
    if notes:
        account["aftermath"] = list(notes)
    if watch.stopped_at is not None:
        sent = ", then ".join(dict.fromkeys(watch.signals)) or "signals"
        notes.append(f"nccl-doctor stopped the job after diagnosing the hang ({sent}); the "
                     "ranks' ends that followed are its doing, not failures")
    else:
        notes.append("the job ended after the hang was diagnosed")
    d = hang_diagnosis(diagnosis, root, dict(traces.stacks), account,
                       annotate.versions_of(traces), annotators, traces)
    return replace(d, notes=d.notes + tuple(n for n in notes if n not in d.notes))


def interrupted(diagnosis: Diagnosis, event) -> Diagnosis:
    """``diagnosis`` of a job the user interrupted: said so, and not a crash for that alone."""
    sent = ", ".join(str(s) for s in event.get("signals", ())) or "a signal"
    at = event.get("at")
    when = (f" at {time.strftime('%H:%M:%S', time.localtime(at))}"
            if isinstance(at, (int, float)) else "")
    note = (f"interrupted by the user ({sent}{when}): the ranks' ends that followed are the "
            "interrupt's doing, not failures; this is the job as it was when it came")
    verdict = diagnosis.verdict
    if verdict is Verdict.CRASH and not any(f.severity is Severity.ERROR
                                            for f in diagnosis.findings):
        warned = any(f.severity is Severity.WARNING for f in diagnosis.findings)
        verdict = Verdict.SUSPECT if warned else Verdict.OK
    return replace(diagnosis, verdict=verdict, notes=(note,) + diagnosis.notes)
