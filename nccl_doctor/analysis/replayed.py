"""The live watchdog's verdict, reached again offline from what it kept (``TraceSet.watch``).

A hang the watchdog called and did not retract stands in the replay: the root cause is the
analysis's own when it names the same divergence (a desync seen in the captures and the kept
Flight Recorder pulls); otherwise - a peer the watchdog saw stuck, idle, over several samples; a
stall past --hang-after - the finding the watchdog recorded, since those samples exist only in
its record. What the backend did afterwards (an NCCL abort, a gloo timeout) is added as such.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Sequence

from nccl_doctor.analysis import annotate
from nccl_doctor.analysis.hang import hang_diagnosis
from nccl_doctor.diagnosis import Diagnosis, Finding
from nccl_doctor.model import TraceSet


def _same(a: Finding | None, b: Finding | None) -> bool:
    return a is not None and b is not None and (a.kind, a.group, a.seq) == (b.kind, b.group, b.seq)


def with_watch(diagnosis: Diagnosis, traces: TraceSet,
               annotators: Sequence[annotate.Annotator] | None = None) -> Diagnosis:
    """``diagnosis`` as the watchdog left it: unchanged unless a hang it called stands."""
    watch = traces.watch
    hang = watch.hang if watch is not None else None
    if watch is None or hang is None:
        return diagnosis
    recorded, own = watch.root, diagnosis.root_cause
    root = own if _same(own, recorded) or recorded is None else recorded
    account = dict(hang.get("watchdog") or {})
    notes = [str(e.get("what")) for e in watch.after_hang("aftermath") if e.get("what")]
    if watch.stopped_at is not None:
        sent = ", then ".join(dict.fromkeys(watch.signals)) or "signals"
        notes.append(f"nccl-doctor stopped the job after diagnosing the hang ({sent}); the "
                     "ranks' ends that followed are its doing, not failures")
    else:
        notes.append("the job ended after the hang was diagnosed")
    d = hang_diagnosis(diagnosis, root, dict(traces.stacks), account,
                       annotate.versions_of(traces), annotators)
    return replace(d, notes=d.notes + tuple(n for n in notes if n not in d.notes))
