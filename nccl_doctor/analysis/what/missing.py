"""``missing_collective``: some ranks of a group entered collective #N, others never did."""

from __future__ import annotations

from nccl_doctor.analysis.calls.align import blocked_event, last_leaf, timelines
from nccl_doctor.analysis.calls.wording import (
    call_fields, call_name, call_site, fate, ranks_text, versions_of,
)
from nccl_doctor.diagnosis import Finding, FindingKind, Severity
from nccl_doctor.model import RankTrace, TraceSet

HINT_EXITED = (
    "A rank ended while its peers still called collectives. Make every rank run the same number "
    "of steps: uneven data per rank is the usual cause (use a DistributedSampler with "
    "drop_last=True, or torch.distributed.algorithms.Join), as are a `break`/`return` taken on one "
    "rank only and an exception caught on one rank."
)
HINT_ELSEWHERE = (
    "The ranks' call sequences diverged: the missing rank is in another collective (or doing "
    "something else) instead. Look for a branch on the rank around the callsites below; every "
    "rank must issue the same collectives in the same order."
)


def instead(trace: RankTrace | None, rank: int) -> tuple[str, str]:
    """(category, words) for what a rank did instead of entering the collective."""
    if trace is None:
        return "no_capture", f"rank {rank} left no capture (did it reach init_process_group?)"
    if not trace.exit.was_running:
        return "exited", f"rank {rank} {fate(trace)}"
    blocked = blocked_event(trace)
    if blocked is not None:
        return "blocked", (
            f"rank {rank} is blocked in {call_name(blocked)} at "
            f"{call_site(blocked, trace.meta.versions)}"
        )
    last = last_leaf(trace)
    where = (f"; last seen after {call_name(last)} at {call_site(last, trace.meta.versions)}"
             if last else "")
    return "elsewhere", f"rank {rank} is outside any collective{where}"


def detect_missing_collective(traces: TraceSet) -> list[Finding]:
    findings = []
    damaged = traces.damaged_ranks()
    for name, timeline in sorted(timelines(traces).items()):
        present = {r: s for r, s in timeline.last_seq.items()}
        for r in timeline.members:  # members that never recorded anything in this group
            # (partial: the others ran unseen; an unrecorded rank ran unseen too)
            if r in traces.ranks or not (traces.partial or r in traces.unrecorded):
                present.setdefault(r, 0)
        if not present:
            continue
        top = max(present.values())
        lagging = {r: s for r, s in present.items() if s < top}
        if not lagging:
            continue
        seq = min(lagging.values()) + 1
        while seq not in timeline.calls and seq <= top:
            seq += 1  # a gap (ring overwrite): take the next collective seen
        waiting = timeline.calls.get(seq, {})
        # a rank whose capture is damaged may have entered it in what the file lost
        missing = sorted(r for r, s in present.items() if s < seq and r not in damaged)
        if not waiting or not missing:
            continue
        first = waiting[min(waiting)]
        versions = versions_of(traces, min(waiting))
        others = {r: instead(traces.ranks.get(r), r) for r in missing}
        categories = {c for c, _ in others.values()}
        hint = HINT_EXITED if categories == {"exited"} else HINT_ELSEWHERE
        title = (
            f"{first.op} #{seq} of group {name}: {ranks_text(sorted(waiting))} entered it, "
            f"{ranks_text(missing)} never did"
        )
        lines = [
            f"{ranks_text(sorted(waiting))} called {first.op}({first.input or '-'}) at "
            f"{call_site(first, versions)}.",
        ]
        flying = sorted(r for r, e in waiting.items() if e.in_flight)
        if flying:
            lines.append(f"{ranks_text(flying)}: the call returned on the CPU but its work never "
                         "completed (Flight Recorder): still waiting for the peers on the "
                         "GPU stream (NCCL) or the work's thread (async_op).")
        lines += [words + "." for _, words in others.values()]
        findings.append(Finding(
            kind=FindingKind.MISSING_COLLECTIVE, severity=Severity.ERROR, title=title,
            detail="\n".join(lines), ranks=tuple(missing), hint=hint, group=name, seq=seq,
            op=first.op, **call_fields(first, versions),
            evidence={
                "waiting_ranks": sorted(waiting), "missing_ranks": missing, "input": first.input,
                "blame": "missing",  # (analysis/who/blame.py: the branch on the rank may decide)
                "instead": {str(r): {"category": c, "detail": w} for r, (c, w) in others.items()},
                "waiting_states": {str(r): "in_flight" if e.in_flight else e.state.name.lower()
                                   for r, e in waiting.items()},
            },
            time_ns=min(e.t_enter_ns for e in waiting.values()),
        ))
    return findings
