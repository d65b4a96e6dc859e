"""``straggler``: the rank(s) consistently last to arrive at collectives. Pure.

Where the supervisor sampled the late rank's stack while its peers waited for it
(``TraceSet.stack_samples``, nccl_doctor/supervisor/straggler_watch.py), the finding says where it was.

For every collective that all members of its group entered, the arrival skew is the latest enter
time minus the earliest, and the last to arrive is noted. Only collectives whose skew is above
``MIN_SKEW_NS`` count (below it, arrival order is noise). A rank last in at least ``SHARE`` of at
least ``MIN_CALLS`` such collectives is a straggler - a warning on a healthy run, never a hang -
if that is not what noise does anyway: on a loaded host (4 ranks on 2 cores) arrival order past
20 ms is often random, and some rank of 4 is last in 3 of 5 skewed collectives 4 times in 10. So
the chance that a rank is last that often when each member is equally likely to be last must be
at most ``CHANCE`` (binomial tail), or its lateness must dwarf the noise: a median skew at least
``NOISE_FACTOR`` times the job's noise floor (the p95 skew of the collectives it was not last at,
at least ``MIN_SKEW_NS``) - five 3 s waits on 2 ranks are not noise though 5 coin flips can be.
Hosts' clocks are compared only within a host (the enter times come from each rank's clock).

On an NCCL group a call returns once it is enqueued: its enter time says when the CPU queued it,
not when the rank arrived (a rank ahead by a start-up offset stays ahead forever; a rank that
enqueues five calls at once "arrives" at all five). There a rank arrives when its kernel starts
on the GPU (``Event.t_gpu_start_ns``, from Flight Recorder with NCCL timing on); collectives of
NCCL groups without it are not compared at all, and ``unmeasured_note`` says so.
"""

from __future__ import annotations

import math
import statistics
from collections import Counter, defaultdict

from nccl_doctor.analysis.align import keep_last, timelines
from nccl_doctor.analysis.wording import call_site, ranks_text
from nccl_doctor.diagnosis import Finding, FindingKind, Severity
from nccl_doctor.model import Event, TraceSet

MIN_SKEW_NS = 20_000_000  # 20 ms
MIN_CALLS = 5
SHARE = 0.6
CHANCE = 1e-3  # at most 1 in 1,000 that noise puts the rank last this often
NOISE_FACTOR = 5

HINT_STRAGGLER = (
    "Every collective waits for the slowest rank, so the whole job runs at its pace. Look at "
    "what it does between the collectives (its callsites below): uneven data or sequence "
    "lengths, extra work on that rank (logging, evaluation, checkpointing on rank 0), a slower "
    "device or host, or CPU contention from dataloader workers."
)


def _p95(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(0.95 * (len(ordered) - 1))))]


def chance_of(k: int, n: int, p: float) -> float:
    """P(X >= k) for X ~ Binomial(n, p): how likely a rank that is last with probability p at
    each of n collectives is last at k or more of them."""
    if k <= 0:
        return 1.0
    if p >= 1.0:
        return 1.0
    log_p, log_q = math.log(p), math.log1p(-p)
    lg_n = math.lgamma(n + 1)
    return min(1.0, sum(math.exp(lg_n - math.lgamma(j + 1) - math.lgamma(n - j + 1)
                                 + j * log_p + (n - j) * log_q) for j in range(k, n + 1)))


def _is_nccl(traces: TraceSet, group: str) -> bool:
    info = traces.groups.get(group)
    return info is not None and "nccl" in info.backend


@keep_last  # the pass and ``unmeasured_note`` ask in turn for the same traces
def _arrivals(traces: TraceSet) -> tuple[list[dict[int, tuple[int, Event]]], Counter]:
    """Per collective that every member of its group (on one host) entered, rank -> (arrival
    time, event); and per NCCL group, how many such collectives had no GPU start times."""
    out: list[dict[int, tuple[int, Event]]] = []
    unmeasured: Counter = Counter()
    hosts = {r: t.meta.host for r, t in traces.ranks.items()}
    for group, timeline in timelines(traces).items():
        members = [r for r in timeline.members if r in traces.ranks]
        if len(members) < 2 or len({hosts[r] for r in members}) > 1:
            continue
        nccl = _is_nccl(traces, group)
        for seq in timeline.seqs():
            calls: dict[int, Event] = timeline.calls[seq]
            if set(calls) != set(members):
                continue
            if not nccl:
                out.append({r: (e.t_enter_ns, e) for r, e in calls.items()})
            elif all(e.t_gpu_start_ns for e in calls.values()):
                out.append({r: (e.t_gpu_start_ns or 0, e) for r, e in calls.items()})
            else:
                unmeasured[group] += 1
    return out, unmeasured


def unmeasured_note(traces: TraceSet) -> str | None:
    """Why collectives of NCCL groups were left out of the straggler pass, if any were."""
    _, unmeasured = _arrivals(traces)
    n = sum(unmeasured.values())
    if n < MIN_CALLS:
        return None
    groups = ", ".join(sorted(unmeasured))
    return (f"stragglers: {n} collectives of NCCL group{'s' if len(unmeasured) > 1 else ''} "
            f"{groups} not compared: no GPU start times (an NCCL call returns once enqueued, so "
            "enqueue times do not say when a rank arrived; run with TORCH_NCCL_ENABLE_TIMING=1 "
            "for Flight Recorder to record kernel starts)")


def skew_series(traces: TraceSet) -> list[tuple[float, float, int]]:
    """Every compared collective as (when the last rank arrived, seconds since the epoch; the
    arrival skew, ms; the last rank), in time order: the straggler's skew over time."""
    out = []
    for arrived in _arrivals(traces)[0]:
        enters = {r: t for r, (t, _) in arrived.items()}
        late = max(enters, key=enters.__getitem__)
        out.append((enters[late] / 1e9, (enters[late] - min(enters.values())) / 1e6, late))
    return sorted(out)


def detect_straggler(traces: TraceSet) -> list[Finding]:
    last_counts: Counter = Counter()
    skews: dict[int, list[float]] = defaultdict(list)  # rank -> skews (ms) when it was last
    before: dict[int, Counter] = defaultdict(Counter)  # rank -> callsites it arrived late at
    lasts: list[tuple[int, float]] = []  # (the last rank, skew in ms) of every compared collective
    odds: list[float] = []  # per skewed collective, the chance of any one member being last
    collectives, _ = _arrivals(traces)
    for arrived in collectives:
        enters = {r: t for r, (t, _) in arrived.items()}
        late = max(enters, key=enters.__getitem__)
        skew = max(enters.values()) - min(enters.values())
        lasts.append((late, skew / 1e6))
        if skew < MIN_SKEW_NS:
            continue
        odds.append(1 / len(enters))
        last_counts[late] += 1
        skews[late].append(skew / 1e6)
        before[late][call_site(arrived[late][1])] += 1
    considered = len(odds)
    if considered < MIN_CALLS:
        return []
    p = sum(odds) / considered
    chance = {r: chance_of(n, considered, p) for r, n in last_counts.items()}
    noise = {r: _noise_ms(lasts, r) for r in last_counts}
    culprits = sorted(r for r, n in last_counts.items() if n / considered >= SHARE
                      and (chance[r] <= CHANCE or statistics.median(skews[r])
                           >= NOISE_FACTOR * noise[r]))
    if not culprits:
        return []
    all_skews = [s for r in culprits for s in skews[r]]
    median, p95 = statistics.median(all_skews), _p95(all_skews)
    where = "; ".join(f"rank {r} arrives last at {site} ({n}x)" for r in culprits
                      for site, n in before[r].most_common(2))
    shares = ", ".join(f"rank {r} last in {last_counts[r]} of {considered}" for r in culprits)
    odds_text = ", ".join(f"{_one_in(chance[r])}" for r in culprits)
    doing = _doing(traces, culprits)
    if doing:
        where += "." + "".join(
            f"\nWhile its peers waited, rank {r} was at "
            + "; ".join(f"{d['frame']} ({d['samples']} of {d['of']} stack samples)"
                        for d in doing[str(r)][:2])
            for r in culprits if str(r) in doing)
    return [Finding(
        kind=FindingKind.STRAGGLER, severity=Severity.WARNING,
        title=f"{ranks_text(culprits)} consistently last to arrive at collectives "
              f"(skew median {median:.0f} ms, p95 {p95:.0f} ms)",
        detail=f"{shares} collectives whose arrival skew exceeded "
               f"{MIN_SKEW_NS / 1e6:.0f} ms (by chance: {odds_text}).\n{where}"
               + ("" if doing else "."),
        ranks=tuple(culprits), hint=HINT_STRAGGLER,
        evidence={"median_ms": round(median, 1), "p95_ms": round(p95, 1),
                  "last": {str(r): last_counts[r] for r in culprits}, "considered": considered,
                  "chance": {str(r): float(f"{chance[r]:.3g}") for r in culprits},
                  "noise_ms": {str(r): round(noise[r], 1) for r in culprits},
                  "doing": doing},
    )]


def _noise_ms(lasts: list[tuple[int, float]], rank: int) -> float:
    """The job's arrival noise as seen without ``rank``: the p95 skew of the collectives at which
    another rank was last (at least ``MIN_SKEW_NS``, below which order is not counted)."""
    others = [skew for late, skew in lasts if late != rank]
    return max(MIN_SKEW_NS / 1e6, _p95(others) if others else 0.0)


def _one_in(chance: float) -> str:
    return "under 1 in a million" if chance < 1e-6 else f"about 1 in {round(1 / chance):,}"


def _doing(traces: TraceSet, culprits: list[int]) -> dict[str, list[dict]]:
    """Per late rank, where its stack samples (taken while peers waited) found it, most often
    first: {rank: [{frame, samples, of, stack}]}."""
    out = {}
    for r in culprits:
        mine = [s for s in traces.stack_samples if s.rank == r and s.frames]
        if not mine:
            continue
        counts = Counter(s.frames[0] for s in mine)
        stacks = {s.frames[0]: list(s.frames) for s in mine}
        out[str(r)] = [{"frame": frame, "samples": n, "of": len(mine), "stack": stacks[frame]}
                       for frame, n in counts.most_common(3)]
    return out
