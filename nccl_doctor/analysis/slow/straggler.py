"""``straggler``: the rank(s) consistently last to arrive at collectives. Pure.

Where the supervisor sampled the late rank's stack while its peers waited for it
(``TraceSet.stack_samples``, nccl_doctor/supervisor/straggler_watch.py), the finding says where it
was.

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
Consistently means in more than one step (``MIN_STEPS``): lateness confined to one step is a burst
- the first step's warm-up (lazy initialisation, caches), or one stretch of CPU starvation on a
loaded host - whose collectives are not independent draws, however many of them it spans.

Ranks are compared with the peers of their role only (analysis/who/roles.py: the same pipeline
stage, the same coordinate on the mesh dims whose ranks do different work): a pipeline's last stage
arriving after its first is the design, not a straggler (a stage slower than the others is
analysis/slow/pipeline_balance.py's). A late rank that works no longer than its peers (its time
outside torch.distributed: analysis/slow/busy.py) while another late rank of its pipeline does was
kept late by that one, through the pipeline's sends and receives: it is said, not named.

On an NCCL group a call returns once it is enqueued: its enter time says when the CPU queued it,
not when the rank arrived (a rank ahead by a start-up offset stays ahead forever; a rank that
enqueues five calls at once "arrives" at all five). There a rank arrives when its kernel starts
on the GPU (``Event.t_gpu_start_ns``, from Flight Recorder with NCCL timing on); collectives of
NCCL groups without it are not compared at all, and ``unmeasured_note`` says so.
"""

from __future__ import annotations

import bisect
import math
import statistics
from collections import Counter, defaultdict
from dataclasses import dataclass

from nccl_doctor.analysis.slow.lateness import (
    MIN_SKEW_NS, Arrival, arrivals, lateness_table, per_step, sites_of, steps_of,
)
from nccl_doctor.analysis.slow.busy import busy_table
from nccl_doctor.analysis.calls.steps import at_site, step_starts
from nccl_doctor.analysis.who.roles import role_text, roles
from nccl_doctor.analysis.calls.wording import call_site, duration, ranks_text
from nccl_doctor.diagnosis import Finding, FindingKind, Severity
from nccl_doctor.model import TraceSet

MIN_CALLS = 5
MIN_STEPS = 2  # steps (analysis/calls/steps.py) in which the rank was last
SHARE = 0.6
CHANCE = 1e-3  # at most 1 in 1,000 that noise puts the rank last this often
NOISE_FACTOR = 5

HINT_STRAGGLER = (
    "Every collective waits for the slowest rank, so the whole job runs at its pace. Look at "
    "what it does between the collectives (its callsites below): uneven data or sequence "
    "lengths, extra work on that rank (logging, evaluation, checkpointing on rank 0), a slower "
    "device or host, or CPU contention from dataloader workers."
)


HINT_SLOW_NODE = (
    "All of this node's ranks arrive late, so the cause is the node, not one rank's work: a "
    "thermally throttled or slower GPU (nvidia-smi -q -d PERFORMANCE,CLOCK), a bad or slower "
    "NIC or link (NCCL_DEBUG=INFO at start-up names the transport each rank uses), a noisy "
    "neighbour or CPU contention on that host (top, dataloader workers), or a slower file "
    "system for its data. Drain it (scontrol update nodename=... state=drain reason=slow) and "
    "run the job without it to confirm."
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


def unmeasured_note(traces: TraceSet) -> str | None:
    """Why collectives of NCCL groups were left out of the straggler pass, if any were."""
    unmeasured = arrivals(traces).unmeasured
    n = sum(unmeasured.values())
    if n < MIN_CALLS:
        return None
    groups = ", ".join(sorted(unmeasured))
    return (f"stragglers: {n} collectives of NCCL group{'s' if len(unmeasured) > 1 else ''} "
            f"{groups} not compared: no GPU start and completion times (an NCCL call returns "
            "once enqueued, so enqueue times do not say when a rank arrived; run with "
            "TORCH_NCCL_ENABLE_TIMING=1 for Flight Recorder to record kernel times)")


def skew_series(traces: TraceSet) -> list[tuple[float, float, int]]:
    """Every compared collective as (when the last rank arrived, seconds since the epoch - across
    hosts, when the call ended on its lowest rank's clock; the arrival skew, ms; the last rank),
    in time order: the straggler's skew over time."""
    return sorted((a.t_ns / 1e9, a.skew_ns / 1e6, a.last) for a in arrivals(traces).calls)


@dataclass(frozen=True)
class _Node:
    host: str
    ranks: tuple[int, ...]
    last: int  # skewed collectives at which one of its ranks was last
    chance: float
    per_step_s: float  # its last rank's lateness, per step
    cost_per_step_s: float  # how long the other hosts' ranks waited for it, per step
    step_s: float


def detect_straggler(traces: TraceSet) -> list[Finding]:
    last_counts: Counter = Counter()
    skews: dict[int, list[float]] = defaultdict(list)  # rank -> skews (ms) when it was last
    before: dict[int, Counter] = defaultdict(Counter)  # rank -> callsites it arrived late at
    # (the last rank, skew in ms, the ranks compared) of every compared collective
    lasts: list[tuple[int, float, tuple[int, ...]]] = []
    took: dict[int, list[float]] = defaultdict(list)  # rank -> per skewed collective it was
    # compared at, the chance of any one of its members being last
    skewed: list[Arrival] = []
    for a in arrivals(traces).calls:
        late, skew = a.last, a.skew_ns
        lasts.append((late, skew / 1e6, tuple(a.late)))
        if skew < MIN_SKEW_NS:
            continue
        skewed.append(a)
        for r in a.late:
            took[r].append(1 / len(a.late))
        last_counts[late] += 1
        skews[late].append(skew / 1e6)
        before[late][call_site(a.events[late])] += 1
    if len(skewed) < MIN_CALLS:
        return []
    # each rank against the collectives it was compared at (its groups, its role's peers): a
    # rank last at every one of its group's is consistently last, whatever other groups do
    seen = {r: len(took[r]) for r in last_counts}
    chance = {r: chance_of(n, seen[r], statistics.fmean(took[r]))
              for r, n in last_counts.items()}
    noise = {r: _noise_ms(lasts, {r}) for r in last_counts}
    culprits = [r for r, n in last_counts.items() if seen[r] >= MIN_CALLS
                and n / seen[r] >= SHARE
                and (chance[r] <= CHANCE or statistics.median(skews[r])
                     >= NOISE_FACTOR * noise[r])]
    culprits = sorted(r for r in culprits
                      if _steps_late(r, arrivals(traces).calls, skewed) >= MIN_STEPS)
    node = _slow_node(traces, skewed, lasts)
    held: dict[int, int] = {}  # a late rank -> the late rank of its pipeline that held it back
    if node is not None:
        culprits = sorted(set(node.ranks))
    else:
        culprits, held = _held_back(traces, culprits, skews, skewed)
    if not culprits:
        return []
    considered = max(seen.get(r, 0) for r in culprits) if node is None else len(skewed)
    table = {row.rank: row for row in lateness_table(traces)}
    all_skews = [s for r in culprits for s in skews[r]]
    median, p95 = statistics.median(all_skews), _p95(all_skews)
    where = "; ".join(f"rank {r} arrives last at {site} ({n}x)" for r in culprits
                      for site, n in before[r].most_common(2))
    doing = _doing(traces, culprits)
    if doing:
        where += "." + "".join(
            f"\nWhile its peers waited, rank {r} was at "
            + "; ".join(f"{d['frame']} ({d['samples']} of {d['of']} stack samples)"
                        for d in doing[str(r)][:2])
            for r in culprits if str(r) in doing)
    peers = _peers_text(traces, culprits, skewed)
    if peers:
        where = peers + "\n" + where
    end = "" if doing else "."  # (the last sentence's period, when it has none)
    if held:
        where += end + "".join(
            f"\nRank {r} arrives late too, but works no longer per step than its peers: it "
            f"waits for rank {q} through their pipeline's sends and receives" for r, q in
            sorted(held.items()))
        end = "."
    across = any(a.across_hosts for a in skewed)
    how = ("\nMeasured without comparing clocks: in a blocking collective the last rank to "
           "arrive waits the least, and each rank's time inside a call is read on its own "
           "clock.") if across else ""
    evidence = {"median_ms": round(median, 1), "p95_ms": round(p95, 1),
                "last": {str(r): last_counts[r] for r in culprits}, "considered": considered,
                "chance": {str(r): float(f"{chance.get(r, 1.0):.3g}") for r in culprits},
                "noise_ms": {str(r): round(noise.get(r, MIN_SKEW_NS / 1e6), 1) for r in culprits},
                "doing": doing, "across_hosts": across,
                "lateness": _table_rows(table, culprits)}
    if node is not None:
        share = node.cost_per_step_s / node.step_s if node.step_s > 0 else 0.0
        others = sorted(r for r in table if r not in node.ranks)
        cost = (f"its peers ({ranks_text(others)}) waited "
                f"{duration(node.cost_per_step_s)} per step for it ({share:.0%} of a "
                f"{duration(node.step_s)} step)")
        evidence.update(node={"host": node.host, "ranks": list(node.ranks), "last": node.last,
                              "chance": float(f"{node.chance:.3g}"),
                              "per_step_s": round(node.per_step_s, 4),
                              "cost_per_step_s": round(node.cost_per_step_s, 4),
                              "cost_share": round(share, 3), "step_s": round(node.step_s, 4)})
        return _finding(
            culprits, HINT_SLOW_NODE, evidence,
            f"node {node.host} ({ranks_text(list(node.ranks))}) is slow: late "
            f"{duration(node.per_step_s)} per step; {cost}",
            f"One of its ranks was last to arrive at {node.last} of {considered} collectives "
            f"whose arrival skew exceeded {MIN_SKEW_NS / 1e6:.0f} ms (by chance: "
            f"{_one_in(node.chance)}), and every one of its ranks was late (skew median "
            f"{median:.0f} ms, p95 {p95:.0f} ms).{how}\n{where}" + end)
    shares = ", ".join(f"rank {r} last in {last_counts[r]} of {seen[r]}" for r in culprits)
    odds_text = ", ".join(f"{_one_in(chance[r])}" for r in culprits)
    costs = "; ".join(
        f"rank {r}: late {duration(table[r].per_step_s)} per step, its peers waited "
        f"{duration(table[r].cost_per_step_s)} per step for it ({table[r].cost_share:.0%} of a "
        f"{duration(table[r].step_s)} step)" for r in culprits if r in table)
    return _finding(
        culprits, HINT_STRAGGLER, evidence,
        f"{ranks_text(culprits)} consistently last to arrive at collectives (skew median "
        f"{median:.0f} ms, p95 {p95:.0f} ms)",
        f"{shares} collectives whose arrival skew exceeded {MIN_SKEW_NS / 1e6:.0f} ms (by "
        f"chance: {odds_text}).{how}\n" + (f"Cost: {costs}.\n" if costs else "") + where
        + end)


def _steps_late(rank: int, every: list[Arrival], skewed: list[Arrival],
                culprits: set[int] | None = None) -> int:
    """In how many of its steps one of ``culprits`` (``rank`` alone by default; a slow node's
    ranks) was the last to arrive at a ``skewed`` collective ``rank`` was compared at: its steps
    start where its calls compared at (of ``every`` one) at its most repeated call site pause
    (analysis/calls/steps.py), on its own clock."""
    culprits = {rank} if culprits is None else culprits
    mine = [a.events[rank] for a in every if rank in a.late]
    starts = step_starts(at_site(mine))
    return len({bisect.bisect_right(starts, a.events[rank].t_enter_ns)
                for a in skewed if a.last in culprits and rank in a.late})


def _held_back(traces: TraceSet, culprits: list[int], skews: dict[int, list[float]],
               skewed: list[Arrival]) -> tuple[list[int], dict[int, int]]:
    """The culprits that another culprit of their pipeline held back, set apart: a rank that
    works (outside torch.distributed) less than half its lateness more than its peers per step,
    while a culprit in its pipeline works that much more than its own peers. A slow stage delays
    its whole replica - the stages after it wait in their receives - so each of them arrives
    late among its own peers; only the slow one did the extra work."""
    held_by: dict[int, int] = {}
    if len(culprits) < 2:
        return culprits, held_by
    busy = busy_table(traces)
    role = roles(traces)
    peers: dict[int, set[int]] = defaultdict(set)
    for a in skewed:
        for r in culprits:
            if r in a.late:
                peers[r] |= set(a.peers) - {r}

    def extra(r: int) -> float | None:  # its work per step beyond its peers', s
        mine = busy.get(r)
        theirs = [busy[p].busy_per_step_s for p in peers[r] if p in busy]
        if mine is None or not theirs:
            return None
        return mine.busy_per_step_s - statistics.median(theirs)

    worked = {r: extra(r) for r in culprits}
    doers = [r for r in culprits if worked[r] is not None
             and worked[r] >= statistics.median(skews[r]) / 1e3 / 2]
    for r in culprits:
        pipeline = role[r].pipeline_group if r in role else None
        if r in doers or worked[r] is None or pipeline is None:
            continue
        cause = [q for q in doers if role[q].pipeline_group == pipeline]
        if cause:
            held_by[r] = cause[0]
    return [r for r in culprits if r not in held_by], held_by


def _peers_text(traces: TraceSet, culprits: list[int], skewed: list[Arrival]) -> str:
    """Whom each culprit was compared with, when its role sets it apart from some ranks."""
    role = roles(traces)
    out = []
    for r in culprits:
        peers = sorted({p for a in skewed if r in a.late for p in a.peers} - {r})
        what = role_text(role[r]) if r in role else ""
        if peers and what:
            out.append(f"Rank {r} ({what}) is compared with the ranks of its role only: "
                       f"{ranks_text(peers)}.")
    return " ".join(out)


def _finding(culprits: list[int], hint: str, evidence: dict, title: str,
             detail: str) -> list[Finding]:
    return [Finding(kind=FindingKind.STRAGGLER, severity=Severity.WARNING, title=title,
                    detail=detail, ranks=tuple(culprits), hint=hint, evidence=evidence)]


#: Rows of the lateness table a finding keeps (its culprits first, then the latest of the rest;
#: the whole table: the Python API's ``lateness``).
TABLE_ROWS = 16


def _table_rows(table: dict, culprits: list[int]) -> list[dict]:
    named = [table[r] for r in culprits if r in table]
    rest = sorted((row for r, row in table.items() if r not in culprits),
                  key=lambda row: -row.per_step_s)
    rows = named[:TABLE_ROWS] + rest[:max(0, TABLE_ROWS - len(named))]
    return [row.to_json() for row in sorted(rows, key=lambda row: row.rank)]


def _slow_node(traces: TraceSet, skewed: list[Arrival],
               lasts: list[tuple[int, float, tuple[int, ...]]]) -> _Node | None:
    """The host whose ranks are all late, when one is: one of its ranks last at ``SHARE`` of
    the skewed collectives spanning hosts, more often than chance allows (``CHANCE``: each
    member equally likely to be last, so a host with more ranks is last more often) or late
    by far more than the noise, and every one of its ranks late by at least half the skew at
    most of them. A host of one rank is a rank, named as such."""
    across = [a for a in skewed if a.across_hosts]
    if len(across) < MIN_CALLS:
        return None
    hosts = {r: t.meta.host for r, t in traces.ranks.items()}
    last_host = Counter(hosts[a.last] for a in across)
    host, n = last_host.most_common(1)[0]
    if n / len(across) < SHARE:
        return None
    ranks = sorted({r for a in across for r in a.late if hosts[r] == host})
    if len(ranks) < 2:
        return None
    p = statistics.fmean(sum(1 for r in a.late if hosts[r] == host) / len(a.late)
                         for a in across)
    chance = chance_of(n, len(across), p)
    mine = [a.skew_ns / 1e6 for a in across if hosts[a.last] == host]
    noise = _noise_ms(lasts, {r for r, h in hosts.items() if h == host})
    if chance > CHANCE and statistics.median(mine) < NOISE_FACTOR * noise:
        return None
    # every rank of the node late: at most of the collectives the node was last to, each of
    # its ranks arrived at least half the skew after the first
    for r in ranks:
        late = [a.late[r] >= a.skew_ns / 2 for a in across if hosts[a.last] == host
                and r in a.late]
        if sum(late) < SHARE * len(late):
            return None
    if _steps_late(ranks[0], arrivals(traces).calls, across, set(ranks)) < MIN_STEPS:
        return None  # one burst
    compared = [a for a in arrivals(traces).calls
                if a.across_hosts and any(hosts[r] == host for r in a.late)]
    steps, step_s = steps_of(compared)
    sites, counts = sites_of(compared)
    node_late: dict = defaultdict(float)  # call site -> the node's lateness there, s
    node_cost: dict = defaultdict(float)  # call site -> how long the others waited for it, s
    for a, site in zip(compared, sites):
        node_last = max(a.late[r] for r in a.late if hosts[r] == host)
        node_late[site] += node_last / 1e9
        gaps = [node_last - t for r, t in a.late.items() if hosts[r] != host]
        if a.skew_ns >= MIN_SKEW_NS and hosts[a.last] == host and gaps:
            node_cost[site] += max(0.0, statistics.median(gaps)) / 1e9
    return _Node(host, tuple(ranks), n, chance, per_step(node_late, counts, steps),
                 per_step(node_cost, counts, steps), step_s)


def _noise_ms(lasts: list[tuple[int, float, tuple[int, ...]]], ranks: set[int]) -> float:
    """The job's arrival noise as seen without ``ranks`` (a late rank, or a slow node's): the
    p95 skew of the collectives they were compared at where another rank was last (at least
    ``MIN_SKEW_NS``, below which order is not counted)."""
    others = [skew for late, skew, members in lasts
              if late not in ranks and not ranks.isdisjoint(members)]
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
