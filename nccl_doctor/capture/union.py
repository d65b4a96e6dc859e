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
from typing import Callable, Iterable, Sequence, TypeVar

from nccl_doctor.model import GroupInfo, RankTrace, TraceSet

T = TypeVar("T")


def newest_per_rank(found: Iterable[T], rank_started: Callable[[T], tuple[int, int]],
                    ) -> tuple[dict[int, T], list[tuple[T, T]]]:
    """rank -> the newest of ``found`` (by start time; of two that started together, the later
    given), and (older, newer) for each one passed over: the one rule by which replay, the
    Python API, the live reader and the union keep a restarted rank's latest capture."""
    newest: dict[int, T] = {}
    passed: list[tuple[T, T]] = []
    for item in found:
        rank, started = rank_started(item)
        held = newest.get(rank)
        if held is None:
            newest[rank] = item
        elif rank_started(held)[1] <= started:
            newest[rank] = item
            passed.append((held, item))
        else:
            passed.append((item, held))
    return newest, passed


Attempt = tuple[int, int]  # (requeues, restarts): model.RankMeta.attempt


def of_attempt(found: Iterable[T], attempt_of: Callable[[T], Attempt],
               attempt: Attempt | None = None) -> tuple[list[T], Attempt | None]:
    """The items of ``attempt`` (None: the latest among them) and that attempt: a job whose
    launcher restarted it (torchrun's ``--max-restarts``, a Slurm requeue) is diagnosed one
    attempt at a time, never a rank of one attempt beside a rank of another."""
    items = list(found)
    if not items:
        return [], attempt
    chosen = max(attempt_of(i) for i in items) if attempt is None else attempt
    return [i for i in items if attempt_of(i) == chosen], chosen


def union(sets: Sequence[TraceSet], source: str = "") -> TraceSet:
    """The job the ``sets`` are parts of. The first set's command, exit status and watchdog
    record lead (put the leader's node first); GPU samples are kept for one host only."""
    if len(sets) == 1:
        return replace(sets[0], source=source or sets[0].source)
    problems = [p for part in sets for p in part.problems]
    ranks, passed = newest_per_rank((t for part in sets for t in part.ranks.values()),
                                    lambda t: (t.rank, t.meta.started_ns))
    for older, newer in passed:
        problems.append(f"rank {newer.rank} has captures on two nodes ({_where(older)} and "
                        f"{_where(newer)}): using the newer, {_where(newer)}")
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
        joining={r: j for p in sets for r, j in sorted(p.joining.items()) if r not in ranks},
    )
    # still partial when ranks are missing and a part said why
    why = "; ".join(dict.fromkeys(p.partial for p in sets if p.partial))
    return replace(merged, partial="" if merged.all_accounted_for() else why)


def _where(trace: RankTrace) -> str:
    name = Path(trace.path).name if trace.path else "a summary"
    return f"{trace.meta.host}:{name}" if trace.meta.host else name
