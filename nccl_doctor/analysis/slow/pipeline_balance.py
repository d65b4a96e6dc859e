"""``pipeline_imbalance``: a pipeline stage that works longer per step than the others. Pure.

A pipeline runs at the pace of its slowest stage: the others wait for it in their sends and
receives (and at the step's collectives) every step. That is not a fault - the job is healthy
and no rank is a straggler (each stage is compared with its own peers: analysis/who/roles.py) - but
it costs time, so it is an info finding with its cost: how much longer the slow stage works per
step than the other stages (its own work, outside torch.distributed: analysis/slow/busy.py), and the
share of each step the other stages spend idle for it.

Said when, in every replica of the pipeline, the same stage works the longest, by at least
``MIN_EXCESS_S`` and ``MIN_SHARE`` of the step more than the median of the other stages; the
figures are the replicas' medians. One replica's stage slower than the same stage of the others
is a straggler, not an imbalance.
"""

from __future__ import annotations

import statistics
from collections import defaultdict

from nccl_doctor.analysis.slow.busy import busy_table
from nccl_doctor.analysis.who.roles import roles, stages_text
from nccl_doctor.analysis.calls.wording import duration, ranks_text
from nccl_doctor.diagnosis import Finding, FindingKind, Severity
from nccl_doctor.model import TraceSet

MIN_EXCESS_S = 0.02  # 20 ms more work per step: below it, scheduling noise
MIN_SHARE = 0.05  # ... and 5% of the step

HINT = (
    "A pipeline runs at the pace of its slowest stage. Move layers from the slow stage to the "
    "others (torch.distributed.pipelining's split points, or pipeline_split_spec), keep work "
    "that only the last stage does (the loss, metrics, logging) light or spread it over the "
    "step, or use more microbatches and a schedule with a smaller bubble (1F1B, interleaved)."
)


def detect_pipeline_imbalance(traces: TraceSet) -> list[Finding]:
    busy = busy_table(traces)
    replicas: dict[str, dict[tuple[int, ...], int]] = defaultdict(dict)  # pipeline -> stages
    num_stages: dict[str, int] = {}
    for r, role in roles(traces).items():
        if role.stages and role.pipeline_group is not None and r in busy:
            replicas[role.pipeline_group][role.stages] = r
            num_stages[role.pipeline_group] = role.num_stages or 0
    slowest: set[tuple[int, ...]] = set()
    figures = []  # per replica: (excess s, share, step s, slow stage's s, the others' s)
    for pipeline, stages in replicas.items():
        if len(stages) < 2 or len(stages) != num_stages[pipeline]:
            continue  # a stage not measured: the replica says nothing
        work = {s: busy[r].busy_per_step_s for s, r in stages.items()}
        slow = max(work, key=work.__getitem__)
        others = [w for s, w in work.items() if s != slow]
        step_s = statistics.median(busy[r].step_s for r in stages.values())
        excess = work[slow] - statistics.median(others)
        if step_s <= 0 or excess < MIN_EXCESS_S or excess / step_s < MIN_SHARE:
            return []  # a balanced replica: an imbalance is the pipeline's, in every replica
        slowest.add(slow)
        figures.append((excess, excess / step_s, step_s, work, pipeline))
    if len(slowest) != 1 or not figures:
        return []
    (slow,) = slowest
    excess = statistics.median(f[0] for f in figures)
    share = statistics.median(f[1] for f in figures)
    step_s = statistics.median(f[2] for f in figures)
    stages = sorted({s for f in figures for s in f[3]})
    work = {s: statistics.median(f[3][s] for f in figures if s in f[3]) for s in stages}
    ranks = sorted(replicas[f[4]][slow] for f in figures)
    others = [s for s in stages if s != slow]
    name, other_names = stages_text(slow), " and ".join(stages_text(s) for s in others)
    per_stage = ", ".join(f"{stages_text(s)} {duration(work[s])}" for s in stages)
    steps = min(busy[r].steps for f in figures for r in replicas[f[4]].values())
    return [Finding(
        kind=FindingKind.PIPELINE_IMBALANCE, severity=Severity.INFO,
        title=(f"pipeline {name} takes {duration(excess)} more per step than {other_names}: "
               f"~{share:.0%} of each step idle on the other stages"),
        detail=(f"Work per step outside torch.distributed (the median of {len(figures)} "
                f"replica{'s' if len(figures) > 1 else ''}, over {steps} steps of "
                f"{duration(step_s)}): {per_stage}. The other stages wait for {name} "
                f"({ranks_text(ranks)}) in their sends, receives and collectives every step; "
                "the job is healthy, and each stage is compared only with its own replicas "
                "for stragglers."),
        ranks=tuple(ranks), hint=HINT,
        evidence={"stage": list(slow), "stages": {_key(s): round(work[s], 4) for s in stages},
                  "excess_per_step_s": round(excess, 4), "idle_share": round(share, 3),
                  "step_s": round(step_s, 4), "replicas": len(figures), "steps": steps})]


def _key(stages: tuple[int, ...]) -> str:
    return ",".join(str(s) for s in stages)
