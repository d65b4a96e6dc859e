"""The findings and the report of a hang the live watchdog called (pure: what it saw in, a
``Diagnosis`` out). The watchdog (nccl_doctor/supervisor/watchdog.py) decides *when*; this module
says *what*: a peer stuck outside collectives, a stall, and the hang report with the stacks."""

from __future__ import annotations

from dataclasses import replace
from typing import Mapping, Sequence

from nccl_doctor.analysis.calls import annotate, threads
from nccl_doctor.analysis.why.loop_counts import DIFFERENT_COUNTS
from nccl_doctor.analysis.calls.situation import Assessment
from nccl_doctor.analysis.calls.wording import call_fields, call_name, ranks_text
from nccl_doctor.words import ranks_verb
from nccl_doctor.diagnosis import Diagnosis, Finding, FindingKind, Severity, Verdict
from nccl_doctor.stacks import places, summary
from nccl_doctor.model import TraceSet
from nccl_doctor.stacks.rank_stack import RankStack
from nccl_doctor.watch_account import WatchAccount

HINT_STUCK = (
    "The waiting ranks can only go on once the stuck rank reaches the same collective. Its stack "
    "shows where it is: an input pipeline or a lock that never returns, a stopped process, or a "
    "branch taken on that rank only that skips the collective."
)
HINT_WORKER = (
    "The stuck rank waits for a batch its DataLoader worker never delivers; the worker's line "
    "above is where it is held up (a lock, a file or network read, a deadlock inside the "
    "dataset or collate function). Fix the worker's code, or give the DataLoader a timeout= "
    "so a stuck worker raises instead of hanging every rank."
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
               stacks: dict[int, RankStack],
               workers: Mapping[int, Mapping[int, RankStack]] | None = None) -> Finding:
    """missing_collective, with what the stuck ranks are doing instead (from their stacks;
    ``workers``: the stacks of a rank's own child processes - its DataLoader's workers - by
    pid, where it waits on them). A stuck rank is stuck: the branch or loop its missing call
    would otherwise be blamed on is not the reason, and is not said."""
    base = next((f for f in analysis.findings if f.kind is FindingKind.MISSING_COLLECTIVE
                 and set(f.absent) & set(stuck)), None)
    lines = []
    for r, why in sorted(stuck.items()):
        where = summary.user_frame(stacks[r]) if r in stacks else None
        source = stacks[r].source if r in stacks else "-"
        found = places.place(stacks[r]) if r in stacks else None
        if found is not None and found.kind is places.PlaceKind.DATALOADER:
            lines.append(f"rank {r} is stuck waiting on its DataLoader's workers at "
                         f"{where or '?'}: {why} (stack from {source}).")
            lines.extend(_worker_lines(r, (workers or {}).get(r, {})))
        else:
            lines.append(f"rank {r} is stuck outside any collective at {where or '?'}: {why} "
                         f"(stack from {source}).")
    if base is not None:
        detail = "\n".join(line for line in base.detail.splitlines()
                           if DIFFERENT_COUNTS not in line)
        looped = base.branch is not None and base.branch.kind in ("for", "while")
        evidence = {**base.evidence, "stuck": {str(r): w for r, w in stuck.items()}}
        evidence.pop("loop", None)
        hint = HINT_WORKER if workers and any(workers.values()) else HINT_STUCK
        return replace(base, detail=detail + "\n" + "\n".join(lines), hint=hint,
                       branch=None if looped else base.branch, evidence=evidence)
    e = next(iter(a.waiting.values()))
    return Finding(
        kind=FindingKind.MISSING_COLLECTIVE, severity=Severity.ERROR,
        title=f"{ranks_verb(sorted(a.waiting), 'waits in')} {call_name(e)}; "
              f"{ranks_text(sorted(stuck))} never came",
        detail="\n".join(lines), ranks=tuple(sorted(stuck)), hint=HINT_STUCK, group=e.group,
        seq=e.align_seq, op=e.op, **call_fields(e),
        evidence={"stuck": {str(r): w for r, w in stuck.items()}}, time_ns=e.t_enter_ns,
    )


def _worker_lines(rank: int, workers: Mapping[int, RankStack]) -> list[str]:
    """Where each worker of ``rank``'s DataLoader is: the line that keeps the batch."""
    if not workers:
        return [f"rank {rank}'s workers could not be sampled (none found, or py-spy could not "
                "read them)."]
    out = []
    for pid, stack in sorted(workers.items()):
        if stack.error and not stack.threads:
            out.append(f"its worker pid {pid}: no stack ({stack.error}).")
            continue
        out.append(f"its worker pid {pid} is at {summary.user_frame(stack) or '?'} "
                   f"[{stack.source}]: that is where the batch is held up.")
    return out


HINT_BLOCKED = {
    places.PlaceKind.GROUP_CREATION: (
        "{who} inside the making of a process group, which ends only when every rank of the "
        "world makes the same group; {peers} in a collective instead. Every rank must make "
        "every group (new_group, new_subgroups, DeviceMesh) at the same point, in the same "
        "order, before any rank uses one."),
    places.PlaceKind.STORE: (
        "{who} in a store-based wait of torch.distributed (a barrier on the store, an object "
        "collective's keys), which ends only when its peers reach the same wait; {peers} in a "
        "collective instead. Make every rank reach the wait, or move the collective after it."),
    places.PlaceKind.RENDEZVOUS: (
        "{who} in the rendezvous of init_process_group, which ends only when every rank has "
        "joined; {peers} already in a collective. Check MASTER_ADDR/MASTER_PORT and the world "
        "size each rank was given."),
}


def blocked_peer(a: Assessment, blocked: Mapping[int, places.Place],
                 analysis: Diagnosis) -> Finding:
    """blocked_wait: the ranks outside collectives are blocked in torch.distributed's own
    waits (their stacks say which), while their peers wait in a collective for them: neither
    wait can end."""
    ranks = sorted(blocked)
    first = blocked[ranks[0]]
    e = min(a.waiting.values(), key=lambda ev: ev.t_enter_ns)
    waiting = sorted(a.waiting)
    title = (f"{ranks_verb(ranks, 'is blocked')} {first.describe()}, while "
             f"{ranks_verb(waiting, 'waits')} in {call_name(e)} for "
             f"{'it' if len(ranks) == 1 else 'them'}: neither wait can end")
    lines = [f"rank {r}: {p.describe()} (from its stack)." for r, p in sorted(blocked.items())]
    lines.append(f"{ranks_verb(waiting, 'waits')} in {call_name(e)}.")
    base = next((f for f in analysis.findings if f.kind is FindingKind.MISSING_COLLECTIVE
                 and set(f.absent) & set(blocked)), None)
    if base is not None:
        lines.append(f"the collective they wait in: {base.title}")
    template = HINT_BLOCKED.get(first.kind, HINT_STUCK)
    hint = template.format(who=ranks_verb(ranks, "is blocked"),
                           peers=ranks_verb(waiting, "waits")) if "{" in template else template
    fields = call_fields(e)
    if first.frame is not None:
        fields = {**fields, "callsite": first.frame.text(),
                  "entry_callsite": None, "call_path": ()}
    return Finding(
        kind=FindingKind.BLOCKED_WAIT, severity=Severity.ERROR, title=title,
        detail="\n".join(lines), ranks=tuple(ranks), hint=hint, group=e.group,
        seq=e.align_seq, op=e.op, **fields,
        evidence={"place": {str(r): p.kind.value for r, p in blocked.items()},
                  "waiting_ranks": waiting},
        time_ns=e.t_enter_ns,
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
