"""Wait chains across groups (analysis/what/wait_chain.py), on findings as the passes write
them: a rank waiting for a rank that waits in another group's call is a link; the chain ends at
the ranks that wait for no one; a cycle ends where it closes; one group alone is no chain."""

from __future__ import annotations

from nccl_doctor.analysis.what.wait_chain import leads_on, wait_links, with_wait_chains
from nccl_doctor.diagnosis import Finding, FindingKind, Severity


def missing(group, seq, waiting, absent, instead=None, detail="d"):
    return Finding(
        kind=FindingKind.MISSING_COLLECTIVE, severity=Severity.ERROR,
        title=f"all_reduce #{seq} of group {group}", detail=detail, ranks=tuple(absent),
        group=group, seq=seq, op="all_reduce",
        evidence={"waiting_ranks": waiting, "missing_ranks": absent,
                  "instead": instead or {}, "blame": "missing"})


def traces(tb):
    return tb.traceset([tb.trace(r, tb.collectives(2), world_size=4) for r in range(4)],
                       {"1": (0, 2), "4": (2, 3), "2": (1, 3)}, world_size=4)


def test_a_chain_through_two_groups_is_said_on_each_of_its_findings(tb):
    outer = missing("1", 3, [0], [2], detail="d\nrank 2 made 1 call fewer: a loop ran "
                                             "a different number of times per rank.")
    end = missing("4", 3, [2], [3], {"3": {"category": "elsewhere",
                                           "detail": "rank 3 is outside any collective"}})
    links = wait_links([outer, end])
    assert {r: link.waits_for for r, link in links.items()} == {0: (2,), 2: (3,)}
    assert leads_on(outer, links) and not leads_on(end, links)
    out = with_wait_chains([outer, end], traces(tb),
                           {"4": "the tensor-parallel (tp) group [2, 3]"})
    said = ("Wait chain: rank 0 waits in all_reduce #3 of group 1 [0, 2] for rank 2; rank 2 "
            "waits in all_reduce #3 of the tensor-parallel (tp) group [2, 3] for rank 3; rank 3 "
            "is outside any collective.")
    assert all(said in f.detail for f in out), [f.detail for f in out]
    chain = out[1].evidence.wait_chain
    assert [c["rank"] for c in chain] == [0, 2, 3] and chain[0]["group_ranks"] == [0, 2]
    assert chain[-1] == {"rank": 3, "ends": "rank 3 is outside any collective"}
    # rank 2 has not come *yet* (it waits in group 4): no loop count is said of it
    assert "different number of times" not in out[0].detail


def test_one_group_alone_is_no_chain(tb):
    f = missing("4", 3, [2], [3])
    assert with_wait_chains([f], traces(tb)) == [f]


def test_ranks_waiting_for_each_other_in_two_groups_end_where_the_cycle_closes(tb):
    a, b = missing("1", 3, [0], [2]), missing("4", 5, [2], [0])
    links = wait_links([a, b])
    assert leads_on(a, links) and leads_on(b, links)  # (the caller keeps them all then)
    out = with_wait_chains([a, b], traces(tb))
    assert [c["rank"] for c in out[0].evidence.wait_chain] == [0, 2], out[0].evidence
    assert out[0].detail.endswith("for rank 0; each waits for the next, in a cycle: no rank can "
                                  "go on (a deadlock)."), out[0].detail


def test_a_finding_whose_absent_rank_ends_a_chain_says_it(tb):
    """Rank 2 waits for rank 0 directly (one group); rank 3 waits for rank 1, which waits for
    rank 0 in another group: the finding that misses rank 0 from rank 2's call says that chain
    too - the ranks rank 0 holds up through other groups."""
    ts = tb.traceset([tb.trace(r, tb.collectives(2), world_size=4) for r in range(4)],
                     {"dp0": (0, 2), "dp1": (1, 3), "tp0": (0, 1)}, world_size=4)
    direct = missing("dp0", 3, [2], [0])
    near, far = missing("tp0", 3, [1], [0]), missing("dp1", 3, [3], [1])
    out = with_wait_chains([direct, near, far], ts)
    for f in out:
        assert [c["rank"] for c in f.evidence.wait_chain] == [3, 1, 0], f.evidence
    said = "Wait chain: rank 3 waits in all_reduce #3 of group dp1 [1, 3] for rank 1"
    assert said in out[0].detail, out[0].detail


SOURCE = """\
def main(dist, steps, rank):
    for step in range(steps):
        dist.all_reduce(step)
        if rank != 1:
            dist.all_reduce(step)
    dist.barrier()
"""


def _blocked(tb, rank, line, path, group, seq):
    from nccl_doctor.location import Location
    from nccl_doctor.model import EventState

    from dataclasses import replace

    from nccl_doctor.files import source_digest

    e = tb.event(1, group=group, seq=seq, state=EventState.ENTERED,
                 callsite=Location(str(path), line, "main"))
    trace = tb.trace(rank, [e], world_size=3)
    return replace(trace, meta=replace(trace.meta, sources={
        str(path): source_digest(path.read_bytes())}))


def test_a_rank_blocked_before_the_call_in_the_same_function_is_behind(tb, tmp_path):
    """Rank 2 waits inside the loop (line 5); ranks 0, 1 wait at the barrier after it (line 6):
    the barrier's finding has rank 2 behind, not past it. Its data-parallel finding (rank 1
    at the barrier, past the loop's call) is not; nor is a call whose loop holds the absent
    rank's line (it may have come round)."""
    from nccl_doctor.analysis.what.wait_chain import behind

    path = tmp_path / "train.py"
    path.write_text(SOURCE)
    ts = tb.traceset([_blocked(tb, 0, 6, path, "w", 1), _blocked(tb, 1, 6, path, "w", 1),
                      _blocked(tb, 2, 5, path, "d", 3)], {"w": (0, 1, 2), "d": (1, 2)},
                     world_size=3)
    barrier = missing("w", 1, [0, 1], [2])
    dp = missing("d", 3, [2], [1])
    assert behind(barrier, ts) and not behind(dp, ts)
    # the same, but both calls in the loop: rank 2 at line 3, the call at line 5
    loop = tb.traceset([_blocked(tb, 1, 5, path, "d", 3), _blocked(tb, 2, 3, path, "w", 4)],
                       {"d": (1, 2), "w": (1, 2)}, world_size=3)
    assert not behind(missing("d", 3, [1], [2]), loop)
    # a source that is not the one that ran is not read: no claim
    path.write_text(SOURCE + "# edited\n")
    assert not behind(barrier, ts)


def test_each_side_of_a_mismatch_waits_for_the_others_in_its_own_call(tb):
    mismatch = Finding(
        kind=FindingKind.COLLECTIVE_MISMATCH, severity=Severity.ERROR, title="t", detail="d",
        ranks=(2,), group="1", seq=11, op="reduce_scatter_single",
        evidence={"aspect": "op", "sides": [{"ranks": [0], "op": "all_gather_single"},
                                            {"ranks": [2], "op": "reduce_scatter_single"}]})
    waiting = missing("4", 7, [3], [2])
    links = wait_links([mismatch, waiting])
    assert {r: (link.waits_for, link.op) for r, link in links.items() if r != 3} == {
        0: ((2,), "all_gather_single"), 2: ((0,), "reduce_scatter_single")}
    assert leads_on(waiting, links)  # rank 2 waits in the mismatch: group 4's is not the cause
    ts = tb.traceset([tb.trace(r, tb.collectives(2), world_size=4) for r in range(4)],
                     {"1": (0, 2), "4": (2, 3)}, world_size=4)
    out = with_wait_chains([mismatch, waiting], ts)
    assert "rank 0 waits in all_gather_single #11 of group 1 [0, 2] for rank 2" in out[1].detail
