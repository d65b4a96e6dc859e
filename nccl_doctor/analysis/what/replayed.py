"""The live watchdog's verdict, reached again offline from what it kept (``TraceSet.watch``).

A hang the watchdog called and did not retract stands, in the report at the end of the run and
in a replay alike: the live report it made (held as a value by the supervisor, kept in
``watchdog.json`` for replay) gives the root cause, the stacks and the account (the evidence of
a peer seen stuck over several samples, or of a stall past --hang-after, exists only there); the
post mortem gives the ranks' ends, the exit status and the other findings.
``watchdog.root_from_captures`` says whether the analysis of the captures and the kept Flight
Recorder pulls names the same divergence by itself (it does for a desync). What the backend did
afterwards (an NCCL abort, a gloo timeout) is added as such.

A job the user interrupted (Ctrl-C, or a scheduler's SIGTERM forwarded by ``run``) is diagnosed
as it was when the interrupt came: the ranks' ends after it were marked stopped by the loader,
so a stall that made the user press Ctrl-C is the root cause, not the KeyboardInterrupt it
raised; a job that was fine until then is not a crash.
"""

from __future__ import annotations

import time
from dataclasses import replace
from typing import Sequence

from nccl_doctor.analysis.calls import annotate
from nccl_doctor.analysis.calls.ends import this_attempts
from nccl_doctor.analysis.what.hang import hang_diagnosis
from nccl_doctor.analysis.what.wait_chain import not_yet
from nccl_doctor.diagnosis import Diagnosis, Finding, Severity, Verdict
from nccl_doctor.model import TraceSet
from nccl_doctor.watch_log import Interrupted, WatchLog


def with_watch(diagnosis: Diagnosis, traces: TraceSet,
               annotators: Sequence[annotate.Annotator] | None = None,
               watch: WatchLog | None = None) -> Diagnosis:
    """``diagnosis`` (the post mortem) as the watchdog left it (``watch``, default the record
    the traces carry): unchanged unless a hang it called stands."""
    # (an earlier launch attempt's decisions are not these ranks': --on-hang restart)
    watch = this_attempts(watch if watch is not None else traces.watch, traces)
    hang = watch.hang if watch is not None else None
    if watch is not None and hang is None and watch.interrupted is not None:
        return interrupted(diagnosis, watch.interrupted)
    if watch is None or hang is None:
        return diagnosis
    own = diagnosis.root_cause
    if hang.report is not None:  # the live report, as a value (live) or as kept (replay)
        d = _standing(diagnosis, hang.report, own)
    else:  # a record of an nccl-doctor that kept the root finding only
        d = hang_diagnosis(diagnosis, hang.root or own, dict(traces.stacks), hang.account,
                           annotate.versions_of(traces), annotators, traces)
    root = d.root_cause
    account = replace(d.watchdog, aftermath=watch.aftermath,
                      root_from_captures=root is not None and own is not None
                      and root.same_call(own))
    notes = list(watch.aftermath)
    if watch.stopped_at is not None:
        sent = ", then ".join(dict.fromkeys(watch.signals)) or "signals"
        notes.append(f"nccl-doctor stopped the job after diagnosing the hang ({sent}); the "
                     "ranks' ends that followed are its doing, not failures")
    else:
        notes.append("the job ended after the hang was diagnosed")
    return replace(d, watchdog=account,
                   notes=d.notes + tuple(n for n in notes if n not in d.notes))


def _standing(post: Diagnosis, live: Diagnosis, own: Finding | None) -> Diagnosis:
    """The post mortem with the hang the watchdog called on top: its root cause first, the
    stacks it took (stack classes, each rank's stack summary) and its account; the ranks' ends,
    the exit status and the other findings are the post mortem's."""
    root = live.root_cause or own
    findings = post.findings
    if root is not None:
        findings = (replace(root, root_cause=True),) + tuple(
            replace(f, root_cause=False) for f in post.findings if not f.same_call(root))
        # (the ranks the watchdog saw stuck have not come yet: no loop count is said of them)
        findings = tuple(not_yet(list(findings)))
    stacked = {r.rank: r.stack_summary for r in live.ranks if r.stack_summary}
    ranks = tuple(replace(r, stack_summary=stacked[r.rank]) if r.rank in stacked else r
                  for r in post.ranks)
    return replace(post, verdict=Verdict.HANG, findings=findings, ranks=ranks,
                   stack_classes=live.stack_classes, watchdog=live.watchdog)


def interrupted(diagnosis: Diagnosis, event: Interrupted) -> Diagnosis:
    """``diagnosis`` of a job a signal from outside interrupted: "interrupted", with who sent
    what and when - never a crash or a hang of the ranks for that alone. A hang called, or an
    error, before the signal came stays the verdict and the root cause."""
    sent = ", ".join(event.signals) or "a signal"
    who = f" from {event.sender}" if event.sender else ""
    when = f" at {time.strftime('%H:%M:%S', time.localtime(event.at))}"
    note = (f"interrupted by {sent}{who}{when}: the ranks' ends that followed are the "
            "interrupt's doing, not failures; this is the job as it was when it came")
    verdict = diagnosis.verdict
    came = event.at * 1e9
    before = [f for f in diagnosis.findings if f.severity is Severity.ERROR
              and (f.time_ns is None or f.time_ns < came)]
    if verdict in (Verdict.OK, Verdict.SUSPECT) or (verdict is Verdict.CRASH and not before):
        verdict = Verdict.INTERRUPTED
    return replace(diagnosis, verdict=verdict, notes=(note,) + diagnosis.notes)
