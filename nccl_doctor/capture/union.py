"""One job from several hosts: the union of per-node trace sets (pure).

A multi-node job leaves one capture directory per node (each `nccl-doctor run` writes its own
``--out``); the leader of a live job holds its own captures plus the other nodes' summaries.
Either way the analysis wants one ``TraceSet``: ranks are unique across nodes (a global rank
lives on one host), so the union is by rank; a rank found twice (a restarted job, a directory
passed twice) keeps its newest capture and says so.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Sequence

from nccl_doctor.model import GroupInfo, RankTrace, TraceSet


def union(sets: Sequence[TraceSet], source: str = "") -> TraceSet:
    """The job the ``sets`` are parts of. The first set's command, exit status and watchdog
    record lead (put the leader's node first); GPU samples are kept for one host only."""
    if len(sets) == 1:
        return replace(sets[0], source=source or sets[0].source)
    ranks: dict[int, RankTrace] = {}
    problems: list[str] = []
    for part in sets:
        problems.extend(part.problems)
        for rank, trace in part.ranks.items():
            previous = ranks.get(rank)
            if previous is None:
                ranks[rank] = trace
                continue
            older, newer = sorted((previous, trace), key=lambda t: t.meta.started_ns)
            ranks[rank] = newer
            problems.append(
                f"rank {rank} has captures on two nodes ({_where(older)} and {_where(newer)}): "
                f"using the newer, {_where(newer)}")
    groups: dict[str, GroupInfo] = {}
    for part in sets:
        for name, info in part.groups.items():
            if name not in groups or len(info.ranks) > len(groups[name].ranks):
                groups[name] = info
    gpus = [p.gpu for p in sets if p.gpu is not None and p.gpu.available]
    gpu = gpus[0] if gpus else next((p.gpu for p in sets if p.gpu is not None), None)
    if len(gpus) > 1:
        problems.append(f"GPU samples of several hosts: only {gpus[0].host or 'one host'}'s are "
                        "analysed")
    lead = sets[0]
    stacks = {}
    for part in reversed(sets):
        stacks.update(part.stacks)
    merged = TraceSet(
        ranks=dict(sorted(ranks.items())), groups=groups,
        world_size=max((p.world_size for p in sets), default=0),
        command=next((p.command for p in sets if p.command), ()),
        exit_status=next((p.exit_status for p in sets if p.exit_status is not None), None),
        problems=tuple(problems), source=source or lead.source,
        metrics_log=next((p.metrics_log for p in sets if p.metrics_log), ()), gpu=gpu,
        stack_samples=tuple(s for p in sets for s in p.stack_samples),
        watch=next((p.watch for p in sets if p.watch is not None), None), stacks=stacks,
        unrecorded={r: why for p in sets for r, why in sorted(p.unrecorded.items())
                    if r not in ranks},
        early_exits={r: e for p in sets for r, e in sorted(p.early_exits.items())
                     if r not in ranks},
    )
    # still partial when ranks are missing and a part said why
    why = "; ".join(dict.fromkeys(p.partial for p in sets if p.partial))
    return replace(merged, partial="" if merged.all_accounted_for() else why)


def _where(trace: RankTrace) -> str:
    name = Path(trace.path).name if trace.path else "a summary"
    return f"{trace.meta.host}:{name}" if trace.meta.host else name
