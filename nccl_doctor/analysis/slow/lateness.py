"""When each rank arrived at the collectives every member of its group made, relative to the
first to arrive, and what its lateness cost the others. Pure.

On one host the ranks share a clock: a rank arrives when it enters the call (gloo), or when its
kernel starts on the GPU (NCCL with Flight Recorder's timing: an NCCL call returns once
enqueued). Across hosts the clocks differ, so no two ranks' times are compared. In a blocking
collective, the last rank to arrive waits the least, and each rank's time inside the call is
measured on its own clock: ``wait = exit - enter`` (gloo), or the kernel's time (NCCL: Flight
Recorder's ``duration_ms``, else its discovered start to completion; capture/flight_recorder.py).
A rank's lateness at a call is the longest wait of its members minus its own. Calls that do not
block (``async_op``, coalesced work) and NCCL calls without both kernel times are not compared
across hosts.

A step is one pass of the job's loop (``steps_of``: the long pauses between the calls at the
group's most repeated call site); a rank's lateness per step is, per call site, its mean lateness
there times the site's calls per step, summed. The lateness table (``lateness_table``) gives per
rank its lateness per call and per step, and its cost: at each call it was last to, how long its
peers waited for it (their median lateness gap), per step and as a share of the step's time.
Only collectives whose skew is at least ``MIN_SKEW_NS`` count as having a last rank: below it,
arrival order is noise.

Ranks are compared with the peers of their role only (analysis/who/roles.py): a collective of a
group whose members have different roles (the world group of a pipeline: its stages) is one
``Arrival`` per role among its members, each measured from the first of its peers to arrive.
The last stage arriving after the first is the pipeline's design, not lateness.
"""

from __future__ import annotations

import statistics
from collections import Counter, defaultdict
from dataclasses import dataclass, field

from nccl_doctor.analysis.calls.align import keep_last, timelines
from nccl_doctor.analysis.who.roles import peer_classes
from nccl_doctor.analysis.calls.steps import at_site, step_starts
from nccl_doctor.analysis.calls.wording import call_site
from nccl_doctor.model import Event, EventFlag, TraceSet

MIN_SKEW_NS = 20_000_000  # 20 ms


@dataclass(frozen=True)
class Arrival:
    """One collective every member of its group completed (or entered, on one host)."""

    group: str
    seq: int  # its aligned sequence number in the group
    late: dict[int, int]  # rank -> ns after the first member arrived
    events: dict[int, Event]
    across_hosts: bool  # measured from each rank's own time in the call
    t_ns: int  # when the last member arrived (on one host; across hosts, when the call ended
    # on its lowest rank's clock): a series of them stays on one clock
    last: int  # the last member to arrive
    skew_ns: int  # how long after the first it arrived
    # the members compared (peers of one role: the whole group when its members share a role)
    peers: tuple[int, ...] = ()

    def waited_for(self, rank: int) -> float:
        """How long the other members waited for ``rank`` here, ns (their median gap)."""
        mine = self.late[rank]
        return statistics.median([max(0, mine - t) for r, t in self.late.items() if r != rank])


def on_nccl(traces: TraceSet, group: str) -> bool:
    """Whether ``group`` runs on NCCL (its calls return once enqueued, before they complete)."""
    info = traces.groups.get(group)
    return info is not None and "nccl" in info.backend


_NOT_BLOCKING = EventFlag.ASYNC | EventFlag.COALESCED
_NONE = EventFlag.NONE


def _wait_ns(e: Event) -> int | None:
    """A gloo rank's time inside a blocking call (None: it did not block, or has not
    returned). (The leader reads 8,192 ranks' summaries at once: no enum arithmetic on the
    common path.)"""
    end = e.t_exit_ns
    if end is None or e.in_flight:
        return None
    flags = e.flags
    if flags is not _NONE and flags & _NOT_BLOCKING:
        return None
    return end - e.t_enter_ns


@dataclass
class Arrivals:
    """Every compared collective, and per group those that could not be compared."""

    calls: list[Arrival] = field(default_factory=list)
    unmeasured: Counter = field(default_factory=Counter)  # NCCL group -> calls without times


@keep_last  # the passes, the table and the notes ask in turn for the same traces
def arrivals(traces: TraceSet) -> Arrivals:
    out = Arrivals()
    hosts = {r: t.meta.host for r, t in traces.ranks.items()}
    for group, timeline in timelines(traces).items():
        members = [r for r in timeline.members if r in traces.ranks]
        if len(members) < 2:
            continue
        classes = peer_classes(traces, members)
        nccl = on_nccl(traces, group)
        for seq in timeline.seqs():
            calls: dict[int, Event] = timeline.calls[seq]
            if set(calls) != set(members):
                continue
            unmeasured = False
            for peers in classes:
                mine = {r: calls[r] for r in peers}
                across = len({hosts[r] for r in peers}) > 1
                found = _across(mine, nccl) if across else _one_host(mine, nccl)
                if found is None:
                    unmeasured = unmeasured or nccl
                    continue
                late, t_last = found
                last = max(late, key=late.__getitem__)
                out.calls.append(Arrival(group, seq, late, mine, across, t_last, last,
                                         late[last], peers))
            if unmeasured:
                out.unmeasured[group] += 1
    return out


def _one_host(calls: dict[int, Event], nccl: bool) -> tuple[dict[int, int], int] | None:
    if nccl:
        if not all(e.t_gpu_start_ns for e in calls.values()):
            return None
        at = {r: e.t_gpu_start_ns or 0 for r, e in calls.items()}
    else:
        at = {r: e.t_enter_ns for r, e in calls.items()}
    first = min(at.values())
    return {r: t - first for r, t in at.items()}, max(at.values())


def _across(calls: dict[int, Event], nccl: bool) -> tuple[dict[int, int], int] | None:
    if nccl:
        if not all(e.t_gpu_start_ns and e.t_gpu_end_ns for e in calls.values()):
            return None
        waits = {r: (e.t_gpu_end_ns or 0) - (e.t_gpu_start_ns or 0) for r, e in calls.items()}
    else:
        waits = {}
        for r, e in calls.items():
            wait = _wait_ns(e)
            if wait is None:
                return None
            waits[r] = wait
    longest = max(waits.values())
    late = {r: longest - w for r, w in waits.items()}
    # when the call ended, on one rank's clock (the lowest's: a series of them stays on it)
    e = calls[min(calls)]
    return late, (e.t_gpu_end_ns or 0) if nccl else (e.t_exit_ns or e.t_enter_ns)


@dataclass(frozen=True)
class RankLateness:
    """A rank's row of the lateness table."""

    rank: int
    host: str
    calls: int  # collectives compared
    last: int  # at how many of them it was the last to arrive
    per_call_s: float  # its mean lateness per collective
    per_step_s: float  # its lateness per step (steps: ``steps``)
    cost_per_step_s: float  # how long its peers waited for it per step
    cost_s: float  # ... in all, over the compared collectives
    step_s: float  # the step's time (its peers' view)
    steps: float  # steps the compared collectives span

    @property
    def cost_share(self) -> float:
        """Its cost as a share of the step's time (0..1)."""
        return self.cost_per_step_s / self.step_s if self.step_s > 0 else 0.0

    def to_json(self) -> dict:
        return {"rank": self.rank, "host": self.host, "calls": self.calls, "last": self.last,
                "per_call_s": round(self.per_call_s, 4), "per_step_s": round(self.per_step_s, 4),
                "cost_per_step_s": round(self.cost_per_step_s, 4),
                "cost_s": round(self.cost_s, 3), "cost_share": round(self.cost_share, 3),
                "step_s": round(self.step_s, 4), "steps": round(self.steps, 1)}


def steps_of(calls: list[Arrival]) -> tuple[float, float]:
    """(steps, seconds per step) the compared collectives span. Per group and role, on one
    rank's own clock, the calls at its most repeated call site (every call where none
    repeats): a step ends at each long pause between one call's return and the next call - at
    least half the longest - so several calls a step from one line (DDP's buckets, a layer's
    all_reduce) still count one step, however long a late peer kept the rank inside the first
    of them; a step's time is the period between the steps' first calls."""
    by_group: dict[tuple, list[Arrival]] = defaultdict(list)
    for a in calls:
        by_group[a.group, a.peers].append(a)
    best: tuple[float, float] = (0.0, 0.0)
    for group_calls in by_group.values():
        rank = min(group_calls[0].events)
        starts = step_starts(at_site([a.events[rank] for a in group_calls]))
        steps = len(starts)
        period = (starts[-1] - starts[0]) / 1e9 / (steps - 1) if steps > 1 else 0.0
        if steps > best[0]:
            best = (float(steps), period)
    return best


def sites_of(calls: list[Arrival]) -> tuple[list[tuple], Counter]:
    """Each compared collective's call site (its group's and its role's, from its lowest rank's
    call), and how many of them each site holds."""
    sites = [(a.group, a.peers, call_site(a.events[min(a.events)])) for a in calls]
    return sites, Counter(sites)


def per_step(sums: dict, counts: Counter, steps: float) -> float:
    """A step's share of what ``sums`` adds up per call site: each site's mean per call, times
    the calls it makes per step (one, or more in a loop inside the step). Per site, not per
    window: a window that cuts a step in two still counts whole steps."""
    out = 0.0
    for site, total in sums.items():
        per = counts[site] / max(steps, 1.0)  # its calls per step (a site seen once: a fraction)
        out += total / counts[site] * (round(per) if per >= 0.5 else per)
    return out


@keep_last  # the straggler pass, the watch and the Python API ask for the same traces
def lateness_table(traces: TraceSet) -> list[RankLateness]:
    """Per rank that took part in a compared collective, its lateness and cost (cost counts
    only the collectives whose skew is at least ``MIN_SKEW_NS``)."""
    found = arrivals(traces).calls
    if not found:
        return []
    steps, step_s = steps_of(found)
    sites, counts = sites_of(found)
    total: dict[int, float] = defaultdict(float)
    by_site: dict[int, dict] = defaultdict(lambda: defaultdict(float))
    count: Counter = Counter()
    last: Counter = Counter()
    cost: dict[int, dict] = defaultdict(lambda: defaultdict(float))
    for a, site in zip(found, sites):
        for r, t in a.late.items():
            total[r] += t
            by_site[r][site] += t / 1e9
            count[r] += 1
        if a.skew_ns >= MIN_SKEW_NS:
            late = a.last
            last[late] += 1
            cost[late][site] += a.waited_for(late) / 1e9
    return [RankLateness(
        rank=r, host=traces.ranks[r].meta.host, calls=count[r], last=last[r],
        per_call_s=total[r] / 1e9 / count[r], per_step_s=per_step(by_site[r], counts, steps),
        cost_per_step_s=per_step(cost[r], counts, steps), cost_s=sum(cost[r].values()),
        step_s=step_s, steps=steps)
        for r in sorted(count)]
