"""``node_lost``: a host of a multi-node job vanished - its supervisor stopped answering with its
ranks still running (SIGKILL of the node, the host down, its network cut). The survivors' errors
that follow (connection closed, timeouts) are consequences; this is their cause."""

from __future__ import annotations

from collections import defaultdict

from nccl_doctor.analysis.calls.align import last_leaf
from nccl_doctor.analysis.calls.wording import call_fields, call_name, call_site, ranks_text
from nccl_doctor.diagnosis import Finding, FindingKind, Severity
from nccl_doctor.model import ExitKind, TraceSet

HINT_LOST = (
    "Find out what happened to the host: its kernel log (dmesg: OOM killer, Xid/hardware "
    "errors), the scheduler's log (preemption, node failure), its network. The other nodes' "
    "errors followed from its loss. Relaunch without it, or with torchrun's elastic "
    "--nnodes MIN:MAX and --max-restarts to survive a lost node."
)


def detect_node_lost(traces: TraceSet) -> list[Finding]:
    hosts: dict[str, list[int]] = defaultdict(list)
    for rank, trace in sorted(traces.ranks.items()):
        if trace.exit.kind is ExitKind.LOST:
            hosts[trace.exit.exception or trace.meta.host or "?"].append(rank)
    findings = []
    for host, ranks in hosts.items():
        first = traces.ranks[ranks[0]]
        node = first.meta.node_rank
        name = f"host {host}" + (f" (node {node})" if node is not None else "")
        lines = [f"{name} stopped answering: its nccl-doctor supervisor and "
                 f"{ranks_text(ranks)} vanished while the job ran."]
        for r in ranks:
            last = last_leaf(traces.ranks[r])
            if last is not None:
                state = "inside" if not last.done else "after"
                lines.append(f"rank {r} was last seen {state} {call_name(last)} at "
                             f"{call_site(last)}")
        last = last_leaf(first)
        findings.append(Finding(
            kind=FindingKind.NODE_LOST, severity=Severity.ERROR,
            title=f"{name} was lost with {ranks_text(ranks)}", detail="\n".join(lines),
            ranks=tuple(ranks), hint=HINT_LOST,
            group=last.group if last else None, seq=last.align_seq if last else None,
            op=last.op if last else None, **(call_fields(last) if last else {}),
            evidence={"host": host, "node_rank": node, "ranks": ranks},
            time_ns=first.exit.time_ns,
        ))
    return findings
