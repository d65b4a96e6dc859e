"""The findings and the report of a hang the live watchdog called (pure: what it saw in, a
``Diagnosis`` out). The watchdog (nccl_doctor/supervisor/watchdog.py) decides *when*; this module
says *what*: a peer stuck outside collectives, a stall, and the hang report with the stacks."""

from __future__ import annotations

from dataclasses import replace
from typing import Mapping, Sequence

from nccl_doctor.analysis import annotate, threads
from nccl_doctor.analysis.situation import Assessment
from nccl_doctor.analysis.wording import call_fields, call_name, ranks_text
from nccl_doctor.words import ranks_verb
from nccl_doctor.diagnosis import Diagnosis, Finding, FindingKind, Severity, Verdict
from nccl_doctor.stacks import summary
from nccl_doctor.model import TraceSet
from nccl_doctor.stacks.rank_stack import RankStack
from nccl_doctor.watch_account import WatchAccount

HINT_STUCK = (
    "The waiting ranks can only go on once the stuck rank reaches the same collective. Its stack "
    "shows where it is: an input pipeline or a lock that never returns, a stopped process, or a "
    "branch taken on that rank only that skips the collective."
)
HINT_STALL_COMM = (
    "Every rank is inside the same collective and none returns: the transport is stuck, not the "
    "program. Check the network/NCCL (NCCL_DEBUG=INFO), a dead peer host, or a GPU that stopped "
    "responding."
)
HINT_STALL_IDLE = (
    "No rank has recorded a call for longer than --hang-after and every rank sits idle at the "
    "same place: typically a dataloader or a lock that never returns, or an input() on a rank. "
    "The stacks show where."
)
HINT_STALL_COMPUTE = (
    "The waiting ranks need a peer that has been computing for longer than --hang-after. If that "
    "is expected (a long evaluation or checkpoint on one rank), raise --hang-after; otherwise the "
    "stack shows the loop it is in."
)


def hang_diagnosis(analysis: Diagnosis, root: Finding | None, stacks: dict[int, RankStack],
                   watch: WatchAccount, versions: Mapping[str, str] | None = None,
                   annotators: Sequence[annotate.Annotator] | None = None,
                   traces: TraceSet | None = None) -> Diagnosis:
    """The hang report: ``root`` first, the stacks (of the threads that make the collectives:
    ``traces`` says which), the watchdog's account; known issues matched again
    (``annotators``, default the installed ones) now that the stacks show which library's code
    each rank is in."""
    stacks = threads.focused(stacks, traces)
    findings = list(analysis.findings)
    if root is not None:
        findings = [replace(root, root_cause=True)] + [
            replace(f, root_cause=False) for f in findings
            if not f.same_call(root)
        ]
    ranks = tuple(
        replace(r, stack_summary=summary.stack_summary(stacks[r.rank]))
        if r.rank in stacks else r
        for r in analysis.ranks
    )
    hang = replace(analysis, verdict=Verdict.HANG, findings=tuple(findings), ranks=ranks,
                   stack_classes=tuple(summary.stack_classes(stacks)), watchdog=watch)
    return annotate.apply(hang, annotate.installed() if annotators is None else annotators,
                          versions or {})


def stuck_peer(a: Assessment, stuck: dict[int, str], analysis: Diagnosis,
                stacks: dict[int, RankStack]) -> Finding:
    """missing_collective, with what the stuck ranks are doing instead (from their stacks)."""
    base = next((f for f in analysis.findings if f.kind is FindingKind.MISSING_COLLECTIVE
                 and set(f.absent) & set(stuck)), None)
    lines = []
    for r, why in sorted(stuck.items()):
        where = summary.user_frame(stacks[r]) if r in stacks else None
        source = stacks[r].source if r in stacks else "-"
        lines.append(f"rank {r} is stuck outside any collective at {where or '?'}: {why} "
                     f"(stack from {source}).")
    if base is not None:
        return replace(base, detail=base.detail + "\n" + "\n".join(lines), hint=HINT_STUCK,
                       evidence={**base.evidence, "stuck": {str(r): w for r, w in stuck.items()}})
    e = next(iter(a.waiting.values()))
    return Finding(
        kind=FindingKind.MISSING_COLLECTIVE, severity=Severity.ERROR,
        title=f"{ranks_verb(sorted(a.waiting), 'waits in')} {call_name(e)}; "
              f"{ranks_text(sorted(stuck))} never came",
        detail="\n".join(lines), ranks=tuple(sorted(stuck)), hint=HINT_STUCK, group=e.group,
        seq=e.align_seq, op=e.op, **call_fields(e),
        evidence={"stuck": {str(r): w for r, w in stuck.items()}}, time_ns=e.t_enter_ns,
    )


def idle_stall(a: Assessment, stuck: dict[int, str], stacks: dict[int, RankStack],
                waited: float) -> Finding:
    lines = [f"rank {r} at {summary.user_frame(stacks[r]) if r in stacks else '?'}: {why}"
             for r, why in sorted(stuck.items())]
    return Finding(
        kind=FindingKind.STALL, severity=Severity.ERROR,
        title=f"stall (compute): no rank has recorded a call for {waited:.0f} s and every rank "
              "is idle outside collectives",
        detail="\n".join(lines), ranks=a.live, hint=HINT_STALL_IDLE,
        evidence={"class": "compute", "idle": True, "waited_s": round(waited, 1),
                  "stuck": {str(r): w for r, w in stuck.items()}},
    )


def stall(a: Assessment, kind: str, waited: float) -> Finding:
    e = min(a.waiting.values(), key=lambda ev: ev.t_enter_ns)
    if kind == "comm":
        title = (f"stall (comm): every rank has been inside {call_name(e)} for {waited:.0f} s "
                 "and none returns")
        culprits, hint = tuple(sorted(a.waiting)), HINT_STALL_COMM
    else:
        waited_in = ranks_verb(sorted(a.waiting), f"has waited {waited:.0f} s in {call_name(e)}")
        title = (f"stall (compute): {waited_in} for {ranks_text(list(a.awaited))}, busy outside "
                 "collectives")
        culprits, hint = a.awaited, HINT_STALL_COMPUTE
    return Finding(
        kind=FindingKind.STALL, severity=Severity.ERROR, title=title,
        detail=f"no rank has recorded a new call for {waited:.0f} s (--hang-after).",
        ranks=culprits, hint=hint, group=e.group, seq=e.align_seq, op=e.op,
        **call_fields(e), evidence={"class": kind, "waited_s": round(waited, 1)},
        time_ns=e.t_enter_ns,
    )
