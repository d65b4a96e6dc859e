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
from nccl_doctor.analysis.what.moment import doing_at
from nccl_doctor.analysis.what.wait_chain import not_yet
from nccl_doctor.diagnosis import Diagnosis, Finding, FindingKind, Severity, Verdict
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
        return interrupted(diagnosis, watch.interrupted, traces)
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
    by_user = watch.interrupted_after_hang
    if by_user is not None:
        notes.insert(0, _interrupt_note(by_user, traces))
    elif watch.stopped_at is not None:
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


#: findings of a wait: at an interrupt, what the ranks were doing when it came - a call some
#: entered and the others had not yet, a wait outside the collectives - never a hang by
#: themselves (only the watchdog, which saw the wait go on, calls one); a mismatch of the
#: ranks' calls is one whenever it is seen
WAITS = frozenset({FindingKind.MISSING_COLLECTIVE, FindingKind.STALL, FindingKind.BLOCKED_WAIT,
                   FindingKind.GPU_BUSY_HANG})


def interrupted(diagnosis: Diagnosis, event: Interrupted, traces: TraceSet | None = None,
                ) -> Diagnosis:
    """``diagnosis`` of a job a signal from outside interrupted: "interrupted", with who sent
    what, when, after how long, and what the ranks were doing at that moment - never a crash or
    a hang of the ranks for that alone. An error found before the signal came (a mismatch of
    the ranks' calls, a rank that raised) stays the verdict and the root cause; a wait in
    progress is what the ranks were doing (``traces``: where it is read from)."""
    came = int(event.at * 1e9)
    this = [f for f in diagnosis.findings if f.attempt is None]
    waits = [f for f in this if f.kind in WAITS]
    findings = [f for f in diagnosis.findings if f not in waits]
    before = [f for f in findings if f.attempt is None and f.severity is Severity.ERROR
              and (f.time_ns is None or f.time_ns < came)]
    verdict = diagnosis.verdict
    if not before and verdict in (Verdict.OK, Verdict.SUSPECT, Verdict.CRASH, Verdict.HANG):
        verdict = Verdict.INTERRUPTED
    elif before and not any(f.root_cause for f in before):
        root = before[0]
        findings = [replace(f, root_cause=f is root) if f.attempt is None else f
                    for f in findings]
    return replace(diagnosis, verdict=verdict, findings=tuple(findings),
                   notes=(_interrupt_note(event, traces),) + diagnosis.notes)


def _interrupt_note(event: Interrupted, traces: TraceSet | None) -> str:
    """"interrupted by you (SIGINT from the terminal (Ctrl-C)) after 12.4 s, at 17:05:10; at
    that moment rank 0 had waited ...; the ranks' ends that followed are the interrupt's doing,
    not failures" - by anything else: "interrupted by SIGTERM from Slurm: its time limit (...)
    at 14:39:00" and the same."""
    came = int(event.at * 1e9)
    sent = ", ".join(event.signals) or "a signal"
    if event.signals == ("SIGINT",):
        said = f"interrupted by you ({sent}" + (f" from {event.sender})" if event.sender
                                                 else ")")
    else:
        said = f"interrupted by {sent}" + (f" from {event.sender}" if event.sender else "")
    starts = [t.meta.started_ns for t in (traces.ranks.values() if traces else ())
              if t.meta.started_ns]
    if starts and came > min(starts):
        said += f" after {_duration(came - min(starts))},"
    said += f" at {time.strftime('%H:%M:%S', time.localtime(event.at))}"
    doing = doing_at(traces, came) if traces is not None else ""
    return (said + (f"; at that moment {doing}" if doing else "")
            + "; the ranks' ends that followed are the interrupt's doing, not failures")


def _duration(ns: int) -> str:
    s = ns / 1e9
    if s < 60:
        return f"{s:.1f} s"
    m, s = divmod(int(s), 60)
    return f"{m} min {s} s" if m < 60 else f"{m // 60} h {m % 60} min"
