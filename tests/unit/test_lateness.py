"""The slow node across hosts, without comparing clocks (analysis/slow/lateness.py, straggler.py):
each rank's time inside a blocking call, read on its own clock, says who arrived last. The
hosts' clocks below are off by seconds (as without NTP); a rule that compared them would
blame whichever host's clock runs ahead."""

from __future__ import annotations

from dataclasses import replace

from nccl_doctor.analysis.slow.lateness import arrivals, lateness_table
from nccl_doctor.analysis.slow.straggler import detect_straggler
from nccl_doctor.model import EventFlag

MS = 1_000_000
STEP_NS = 400 * MS


def job(tb, slow_host: str | None, late_ms: float, steps: int = 12, *,
        clock_ms=(0, 7_000, -3_000), ranks_per_host: int = 2, flags: EventFlag = EventFlag.NONE,
        jitter_ms: float = 0.0):
    """3 hosts x ``ranks_per_host`` ranks, ``steps`` steps of two all_reduces each; the ranks of
    ``slow_host`` arrive ``late_ms`` late at each step's first call (the others wait that long in
    it). Each host's clock is off by ``clock_ms``."""
    hosts = ["h0", "h1", "h2"]
    traces = []
    world = len(hosts) * ranks_per_host
    for r in range(world):
        host = hosts[r // ranks_per_host]
        offset = clock_ms[hosts.index(host)] * MS
        slow = host == slow_host
        events = []
        for step in range(steps):
            for k in range(2):
                idx = 2 * step + k + 1
                start = offset + step * STEP_NS + k * 10 * MS
                late = int(late_ms * MS) if k == 0 else 0
                noise = int(jitter_ms * MS * (((r * 7 + idx * 13) % 5) - 2) / 2)
                enter = start + (late if slow else 0) + noise
                exit_ = start + late + 2 * MS  # the call ends for everyone once the last came
                e = tb.event(idx, group_size=world, t_enter_ns=enter, flags=flags,
                               line=40 + k)  # the loop's two lines
                events.append(replace(e, t_exit_ns=exit_))
        traces.append(tb.trace(r, events, world_size=world, host=host))
    return tb.traceset(traces)


def test_every_rank_of_the_slow_host_is_named_as_its_node_with_its_cost(tb):
    (f,) = detect_straggler(job(tb, "h1", 300))
    node = f.evidence["node"]
    assert node["host"] == "h1" and node["ranks"] == [2, 3] and f.ranks == (2, 3)
    assert abs(node["per_step_s"] - 0.300) < 0.01, node
    assert abs(node["cost_per_step_s"] - 0.300) < 0.01, node
    assert abs(node["step_s"] - 0.400) < 0.01 and abs(node["cost_share"] - 0.75) < 0.03
    assert f.evidence["across_hosts"] is True
    assert f.title.startswith("node h1 (ranks 2, 3) is slow: late 300 ms per step")
    assert "without comparing clocks" in f.detail


def test_the_clocks_do_not_matter_and_a_healthy_job_has_no_straggler(tb):
    assert detect_straggler(job(tb, None, 0, jitter_ms=6)) == []
    for clocks in ((0, 0, 0), (0, 60_000, -60_000), (5, -5, 0)):
        (f,) = detect_straggler(job(tb, "h2", 150, clock_ms=clocks))
        assert f.evidence["node"]["host"] == "h2", clocks


def test_the_lateness_table_gives_every_rank_its_lateness_and_cost(tb):
    rows = {row.rank: row for row in lateness_table(job(tb, "h0", 200))}
    assert set(rows) == set(range(6))
    for r in (0, 1):
        assert abs(rows[r].per_step_s - 0.200) < 0.005 and rows[r].host == "h0"
    for r in (2, 3, 4, 5):
        assert rows[r].per_step_s < 0.005 and rows[r].cost_s == 0
    assert abs(rows[0].cost_s + rows[1].cost_s - 12 * 0.200) < 0.05
    assert rows[0].steps == 12 and abs(rows[0].step_s - 0.400) < 0.01


def test_without_a_repeated_call_site_each_call_is_a_step(tb):
    traces = job(tb, "h1", 300)
    traces = replace(traces, ranks={r: replace(t, events=tuple(
        replace(e, callsite=replace(e.callsite, line=100 + e.idx)) for e in t.events))
        for r, t in traces.ranks.items()})
    row = {row.rank: row for row in lateness_table(traces)}[2]
    # the steps are told by the long gaps between calls: 12 of them, 300 ms late each
    assert row.steps == 12 and abs(row.per_step_s - 0.300) < 0.005, row


def test_several_calls_a_step_from_one_line_are_one_step(tb):
    """Tensor parallel's per-layer all_reduce, DDP's buckets: 4 calls a step from one line,
    the first of them 300 ms late on h1."""
    traces = job(tb, "h1", 300)
    traces = replace(traces, ranks={r: replace(t, events=tuple(
        replace(e, callsite=replace(e.callsite, line=40)) for e in t.events))
        for r, t in traces.ranks.items()})
    (f,) = detect_straggler(traces)
    node = f.evidence["node"]
    assert abs(node["per_step_s"] - 0.300) < 0.01 and abs(node["step_s"] - 0.400) < 0.01, node


def test_calls_that_do_not_block_are_not_compared_across_hosts(tb):
    traces = job(tb, "h1", 300, flags=EventFlag.ASYNC)
    assert arrivals(traces).calls == [] and detect_straggler(traces) == []


def test_one_late_rank_is_a_rank_not_a_node(tb):
    traces = job(tb, "h1", 300)
    # rank 3 (h1) on time: only rank 2 is late
    fixed = []
    for e in traces.ranks[3].events:
        fixed.append(replace(e, t_enter_ns=e.t_exit_ns - 302 * MS if e.idx % 2 else e.t_enter_ns))
    traces = replace(traces, ranks={**traces.ranks, 3: replace(traces.ranks[3],
                                                                 events=tuple(fixed))})
    (f,) = detect_straggler(traces)
    assert "node" not in f.evidence and f.ranks == (2,), f.title
    assert "its peers waited" in f.detail


def _nccl(traces, timed: bool):
    """The job on NCCL: calls return once enqueued; Flight Recorder's kernel times (each on its
    rank's own clock) say how long each rank was inside (``timed``), or nothing."""
    from nccl_doctor.model import GroupInfo

    ranks = {}
    for r, t in traces.ranks.items():
        events = []
        for e in t.events:
            start, end = e.t_enter_ns, e.t_exit_ns
            events.append(replace(e, t_exit_ns=e.t_enter_ns + 50_000,  # enqueued, returned
                                  t_gpu_start_ns=start if timed else None,
                                  t_gpu_end_ns=end if timed else None))
        ranks[r] = replace(t, events=tuple(events))
    groups = {g: GroupInfo(g, info.ranks, "nccl") for g, info in traces.groups.items()}
    return replace(traces, ranks=ranks, groups=groups)


def test_on_nccl_the_kernels_time_names_the_slow_node_and_without_it_nothing_is_compared(tb):
    from nccl_doctor.analysis.slow.straggler import unmeasured_note

    (f,) = detect_straggler(_nccl(job(tb, "h2", 250), timed=True))
    assert f.evidence["node"]["host"] == "h2"
    assert abs(f.evidence["node"]["per_step_s"] - 0.250) < 0.01
    untimed = _nccl(job(tb, "h2", 250), timed=False)
    assert detect_straggler(untimed) == []
    assert "TORCH_NCCL_ENABLE_TIMING=1" in unmeasured_note(untimed)


def test_a_group_without_the_slow_hosts_ranks_changes_nothing(tb):
    """A second group spanning the other two hosts (found by review: the node's cost over it
    asked for the largest of no lateness at all)."""
    traces = job(tb, "h2", 300)
    extra = {}
    for r in (0, 2):
        events = list(traces.ranks[r].events)
        base = events[-1].idx
        for i in range(1, 7):
            e = tb.event(base + i, group="1", seq=i, group_size=2,
                           t_enter_ns=events[-1].t_enter_ns + i * STEP_NS)
            events.append(replace(e, t_exit_ns=e.t_enter_ns + 2 * MS))
        extra[r] = replace(traces.ranks[r], events=tuple(events))
    traces = replace(traces, ranks={**traces.ranks, **extra},
                     groups={**traces.groups, "1": replace(traces.groups["0"], name="1",
                                                           ranks=(0, 2))})
    (f,) = detect_straggler(traces)
    assert f.evidence["node"]["host"] == "h2"


def test_a_summary_from_the_version_before_gpu_end_times_still_reads(tb):
    from nccl_doctor.capture import summary

    trace = job(tb, "h1", 300).ranks[2]
    packed = summary.summarize(trace)
    packed["events"] = [raw[:-1] for raw in packed["events"]]  # 25 fields, as before
    back = summary.unsummarize(packed)
    assert [e.t_gpu_end_ns for e in back.events] == [None] * len(back.events)
    assert [e.t_exit_ns for e in back.events] == [e.t_exit_ns for e in trace.events][-len(
        back.events):]
