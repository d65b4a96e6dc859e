"""Stragglers while the job runs: what the late rank does while its peers wait for it.

Every ``every`` seconds (longer when a look is slow: at most 5% of the supervisor's time goes to
them), if the job progressed, the supervisor reads the captures and runs the straggler pass.
When it names late ranks and, at that moment, a late rank is outside any collective while peers
have entered one it has not (``waited_by``), the late rank's stack is sampled (py-spy
``--nonblocking``: the rank is never paused; else its in-rank agent) into ``stragglers.jsonl``.
The post-mortem straggler finding then says where the late rank spends the time its peers wait.
Late ranks are those late among the peers of their role (analysis/who/roles.py: the same pipeline
stage, the same coordinate on the mesh dims whose ranks do different work), as in the report.
Never a hang: hangs are the watchdog's; this watch stands aside while every rank waits (a
deadlock being confirmed, a stall) or a hang is called. A late rank of another node is
sampled by that node's doctor (the leader asks it, as for a hang's stacks).

Each look also reads the lateness table (analysis/slow/lateness.py): every rank's lateness per step
(``lateness``), and the time ranks waited for the last to arrive at each skewed collective,
added up once per collective (``cost``): what ``run --serve`` publishes for a dashboard.
"""

from __future__ import annotations

import time
from typing import Callable

from nccl_doctor.analysis.calls.align import blocked_event, timelines
from nccl_doctor.analysis.slow.lateness import MIN_SKEW_NS, arrivals, lateness_table
from nccl_doctor.analysis.slow.straggler import detect_straggler
from nccl_doctor.analysis.slow.waits import detect_slow_node_from_waits
from nccl_doctor.analysis.calls.threads import focused
from nccl_doctor.model import TraceSet
from nccl_doctor.finding_evidence import StragglerEvidence
from nccl_doctor.stacks import summary
from nccl_doctor.stacks.samples import SampleLog, StackSample
from nccl_doctor.supervisor import evidence
from nccl_doctor.supervisor.watching import LiveJob, Snapshot


DUTY = 20.0  # wait at least this many times a look's own duration before the next one


class StragglerWatch:
    """A watch of the supervisor (``look`` once per tick). ``hang_suspected()`` says when every
    rank waits or a hang is called (the watchdog's business: this watch stands aside)."""

    what = "straggler sampling"  # named when it fails (the supervisor drops it then)

    def __init__(self, job: LiveJob, hang_suspected: Callable[[], bool], *,
                 every: float = 10.0) -> None:
        assert job.policy is not None  # the supervisor runs its watches only with a policy
        self.job, self.policy = job, job.policy
        self.hang_suspected, self.every = hang_suspected, every
        self.log = SampleLog(job.out_dir)
        self._last = job.clock()
        self._cost = 0.0  # how long the last look took
        self._seen: dict[int, int] = {}
        self.skew: dict[int, float] = {}  # the late ranks of the last look, their median skew
        self.lateness: dict[int, float] = {}  # rank -> its lateness per step, s (last look)
        self.cost: dict[int, float] = {}  # rank -> the time peers waited for it, s (in all)
        self._costed: dict[str, int] = {}  # group -> the newest collective counted in ``cost``

    def due(self, now: float) -> float:
        """Seconds from ``now`` to its next look (the supervisor's loop sleeps until then)."""
        return self._last + max(self.every, DUTY * self._cost) - now

    def look(self, snap: Snapshot) -> None:
        now = self.job.clock()
        # a look reads every capture: at most 5% of the supervisor's time goes to them
        if now - self._last < max(self.every, DUTY * self._cost):
            return
        self._last = now
        try:
            self._look(snap)
        finally:
            self._cost = self.job.clock() - now

    def _look(self, snap: Snapshot) -> None:
        if snap.counts == self._seen or self.hang_suspected():
            return  # nothing new, or every rank waits: that is the watchdog's business
        self._seen = dict(snap.counts)
        traces = snap.traces
        if traces is None:
            return
        before = snap.read_counts  # polled right before the read that says who waits
        self._measure(traces)
        # (a job of many nodes: the other nodes' digests carry no calls to compare, only their
        # waits, from which a slow node is named)
        found = detect_straggler(traces) or detect_slow_node_from_waits(traces)
        # rank -> its median lateness, s (what ``run --serve`` shows)
        self.skew = {r: f.evidence.median_ms / 1e3 for f in found for r in f.ranks
                     if isinstance(f.evidence, StragglerEvidence)}
        late = sorted({r for f in found for r in f.ranks})
        local = {r: p.pid for r, p in self.job.local().items()}
        targets, remote, waiting = {}, [], {}
        for rank in late:
            if not self.log.full(rank):
                peers = waited_by(traces, rank)
                if peers and rank in local:
                    targets[rank], waiting[rank] = local[rank], peers
                elif peers:
                    remote.append(rank)
                    waiting[rank] = peers
        if not targets and not remote:
            return
        timeout = self.policy.stack_timeout
        stacks = dict(evidence.collect_stacks(targets, self.job.run_id, timeout=timeout)
                      if targets else {})
        if remote:  # sampled by their node's doctor, on their own host
            stacks.update(self.job.stacks(remote, timeout))
        stacks = focused(stacks, traces)
        after = snap.poll() if snap.poll is not None else self.job.registry.poll()
        for rank, stack in sorted(stacks.items()):
            where = summary.user_frames(stack)
            # a rank that recorded a call since the read reached the collective before the
            # sample was taken: where it was while its peers waited is not known
            if where and before.get(rank) == after.get(rank):
                self.log.add(StackSample(time.time(), rank, where, waiting[rank], stack.source))


    def _measure(self, traces: TraceSet) -> None:
        """The lateness table's per-step lateness, and the waits of the collectives not counted
        yet added to each last rank's cost."""
        self.lateness = {row.rank: row.per_step_s
                         for row in lateness_table(traces)}
        newest: dict[str, int] = {}
        for a in arrivals(traces).calls:
            newest[a.group] = max(newest.get(a.group, -1), a.seq)
            if a.seq <= self._costed.get(a.group, -1) or a.skew_ns < MIN_SKEW_NS:
                continue
            late = a.last
            self.cost[late] = self.cost.get(late, 0.0) + a.waited_for(late) / 1e9
        self._costed.update(newest)


def waited_by(traces: TraceSet, rank: int) -> tuple[int, ...]:
    """The peers waiting for ``rank`` now: it is outside any collective, and they entered a
    collective of a group they share that it has not entered yet (on NCCL their calls return at
    once, but the collective cannot complete without it)."""
    trace = traces.ranks.get(rank)
    if trace is None or blocked_event(trace) is not None:
        return ()
    peers = set()
    for timeline in timelines(traces).values():
        mine = timeline.last_seq.get(rank)
        if mine is None:
            continue
        peers |= {r for r, seq in timeline.last_seq.items() if r != rank and seq > mine}
    return tuple(sorted(peers))
