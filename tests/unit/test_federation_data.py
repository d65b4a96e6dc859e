"""What the nodes of a multi-node job exchange and how one job is made of its parts (pure):
rank summaries (capture/summary.py), the union (capture/union.py), node_lost, partial sets."""

import json

from nccl_doctor.analysis import analyze
from nccl_doctor.analysis.what.lost import detect_node_lost
from nccl_doctor.capture import summary
from nccl_doctor.capture.union import union
from nccl_doctor.diagnosis import Diagnosis, FindingKind
from nccl_doctor.model import ExitKind, RankExit, Unrecorded


def test_a_summary_is_the_trace_in_brief_and_json(tb):
    from dataclasses import replace

    from nccl_doctor.location import Location

    path = (Location("/v/site-packages/trl/trainer/cpo_trainer.py", 839, "get_batch_loss_metrics"),
            Location("/job/train.py", 16, "main"))
    events = [replace(e, path=path) if e.idx % 2 else e
              for e in tb.collectives(5000, group_size=2, last_state=tb.ENTERED)]
    notes = ([{"note": "group", "name": "0", "ranks": [0, 1]}]
             + [{"note": "rng", "label": "torch.manual_seed", "seed": 7, "time_ns": 1}]
             + [{"note": "rng", "label": "step", "time_ns": i} for i in range(500)]
             + [{"note": "gen", "all": f"h{i}", "time_ns": i} for i in range(500)])
    trace = replace(tb.trace(0, events), notes=tuple(notes))
    raw = json.loads(json.dumps(summary.summarize(trace)))
    back = summary.unsummarize(raw)
    assert len(back.events) <= summary.TAIL + summary.GROUPS
    assert back.events == trace.events[-len(back.events):]  # call paths included
    assert {e.path for e in back.events} == {(), path}
    assert back.meta == trace.meta and back.exit == trace.exit
    assert raw["dropped"] == 5000 - len(back.events)
    kinds = [n["note"] for n in back.notes]
    assert kinds.count("gen") == summary.NOTES_KEPT["gen"]
    # the seeding call survives hundreds of per-step RNG notes; the group layout too
    assert any(n.get("label") == "torch.manual_seed" for n in back.notes)
    assert {"note": "group", "name": "0", "ranks": [0, 1]} in back.notes
    assert len(json.dumps(raw)) < 40_000


def test_a_summary_keeps_each_groups_last_call_and_enclosing_records(tb):
    old = tb.event(1, "all_gather", group="7", seq=1)
    events = [old] + tb.collectives(200, start=2)
    kept = summary.kept_events(events, tail=10)
    assert kept[0] == old and len(kept) == 11
    wrapper = tb.event(300, "all_gather_object", seq=-1)
    inner = [tb.event(300 + i, "all_gather", parent=300) for i in range(1, 12)]
    kept = summary.kept_events(events + [wrapper] + inner, tail=10)
    assert wrapper in kept and kept[-1] == inner[-1]


def test_a_bad_summary_is_a_value_error(tb):
    import pytest
    with pytest.raises(ValueError):
        summary.unsummarize({"meta": {}})


def test_summaries_give_the_same_root_cause_as_the_captures(tb):
    full = tb.traceset([
        tb.trace(0, tb.collectives(300, last_state=tb.ENTERED)),
        tb.trace(1, tb.collectives(299) + [tb.event(300, "broadcast", state=tb.ENTERED)]),
    ])
    brief = union([
        tb.traceset([full.ranks[0]]),
        tb.traceset([summary.unsummarize(summary.summarize(full.ranks[1]))],
                    groups={"0": (0, 1)})])
    a, b = analyze(full, annotators=()).root_cause, analyze(brief, annotators=()).root_cause
    assert (a.kind, a.ranks, a.seq, a.group) == (b.kind, b.ranks, b.seq, b.group)


def test_the_union_is_by_rank_and_says_which_capture_it_kept(tb):
    a = tb.traceset([tb.trace(0, tb.collectives(3), host="nodeA")], world_size=2)
    b = tb.traceset([tb.trace(1, tb.collectives(3), host="nodeB")], world_size=2)
    u = union([a, b])
    assert sorted(u.ranks) == [0, 1] and u.world_size == 2 and not u.problems
    from dataclasses import replace
    newer = replace(b.ranks[1], meta=replace(b.ranks[1].meta, started_ns=b.ranks[1].meta.started_ns + 1))
    u = union([a, b, tb.traceset([newer])])
    assert u.ranks[1] is newer and "rank 1 has captures on two nodes" in u.problems[0]


def test_the_union_keeps_the_ranks_no_node_could_record(tb):
    from dataclasses import replace
    a = tb.traceset([tb.trace(0, tb.collectives(3), host="nodeA")], world_size=3)
    b = tb.traceset([tb.trace(1, tb.collectives(3), host="nodeB")], world_size=3)
    u = union([a, replace(b, unrecorded={2: Unrecorded("no room", "B")}, partial="node B only")])
    assert u.unrecorded == {2: Unrecorded("no room", "B")} and u.partial == ""  # all accounted for
    assert union([a, b]).unrecorded == {}


def test_findings_name_the_hosts_of_their_ranks(tb):
    traces = tb.traceset([
        tb.trace(0, tb.collectives(3, last_state=tb.ENTERED), host="nodeA"),
        tb.trace(1, tb.collectives(2) + [tb.event(3, "broadcast", state=tb.ENTERED)],
                 host="nodeB")])
    root = analyze(traces, annotators=()).root_cause
    assert root.evidence["hosts"] == {str(r): "nodeA" if r == 0 else "nodeB" for r in root.ranks}
    assert " on node" in root.title
    one_host = analyze(tb.traceset([tb.trace(r, t.events) for r, t in traces.ranks.items()]),
                       annotators=()).root_cause
    assert "hosts" not in one_host.evidence


def test_a_finding_on_many_hosts_names_three_and_counts_the_rest(tb):
    """40 ranks on 40 hosts run out of data after collective #2; rank 0 goes on to #3. The exit
    finding's title names three hosts and counts the others; its evidence maps every rank."""
    world = 41
    traces = [tb.trace(0, tb.collectives(3, group_size=world, last_state=tb.ENTERED),
                       world_size=world, host="node0")]
    traces += [tb.trace(r, tb.collectives(2, group_size=world), tb.clean(tb.T0 + 5 * tb.STEP),
                        world_size=world, host=f"node{r}") for r in range(1, world)]
    d = analyze(tb.traceset(traces), annotators=())
    exited = next(f for f in d.findings if f.kind is FindingKind.RANK_EXITED)
    assert exited.ranks == tuple(range(1, world))
    assert "[rank 1 on node1; rank 2 on node2; rank 3 on node3; ... 37 more hosts]" in exited.title
    assert exited.evidence["hosts"] == {str(r): f"node{r}" for r in range(1, world)}


def test_a_lost_node_is_the_root_cause_not_its_stale_calls(tb):
    lost = RankExit(ExitKind.LOST, exception="nodeB", time_ns=tb.T0)
    traces = tb.traceset([
        tb.trace(0, tb.collectives(4, last_state=tb.ENTERED), host="nodeA", world_size=3),
        tb.trace(1, tb.collectives(3), lost, host="nodeB", world_size=3),
        tb.trace(2, tb.collectives(3), lost, host="nodeB", world_size=3)],
        groups={"0": (0, 1, 2)})
    found = detect_node_lost(traces)
    assert [(f.kind, f.ranks, f.evidence["host"]) for f in found] == [
        (FindingKind.NODE_LOST, (1, 2), "nodeB")]
    d = analyze(traces, annotators=())
    assert d.root_cause.kind is FindingKind.NODE_LOST and "host nodeB" in d.root_cause.title
    assert not [f for f in d.findings if f.kind is FindingKind.MISSING_COLLECTIVE]
    assert {s.rank: s.state for s in d.ranks}[1] == "lost"


def test_ranks_gone_unrecorded_beside_a_lost_node_follow_its_loss(tb):
    """Ray ends a job's actors when its driver fails on the lost node's actors: the ranks on the
    surviving host vanish (no exit record) inside the collective the lost node's rank never
    entered, their last call before the node's last beat.
    The loss is the cause; a rank that raised before the loss still is."""
    lost = RankExit(ExitKind.LOST, exception="nodeC", time_ns=tb.T0 + 10**12)
    vanished = RankExit(ExitKind.VANISHED)

    def job(first: RankExit, calls: int = 4):
        return tb.traceset([
            tb.trace(0, tb.collectives(calls, last_state=tb.ENTERED if calls == 4 else tb.RETURNED),
                     first, host="nodeA", world_size=4),
            tb.trace(1, tb.collectives(4, last_state=tb.ENTERED), vanished, host="nodeA",
                     world_size=4),
            tb.trace(2, tb.collectives(4, last_state=tb.ENTERED), lost, host="nodeC",
                     world_size=4),
            tb.trace(3, tb.collectives(3), lost, host="nodeC", world_size=4)],
            groups={"0": (0, 1, 2, 3)})

    d = analyze(job(vanished), annotators=())
    assert d.root_cause.kind is FindingKind.NODE_LOST and d.root_cause.ranks == (2, 3)
    assert any(f.kind is FindingKind.RANK_EXITED and f.ranks == (0, 1) for f in d.findings)
    # rank 0 killed by a signal before the collective, at a known time before the loss
    killed = RankExit(ExitKind.SIGNAL, signal="SIGKILL", time_ns=tb.T0 + 10)
    d = analyze(job(killed, calls=3), annotators=())
    assert d.root_cause.kind is FindingKind.RANK_EXITED and d.root_cause.ranks == (0,), [
        (f.kind, f.ranks, f.time_ns) for f in d.findings]


def test_a_partial_job_never_blames_the_ranks_it_cannot_see(tb):
    from dataclasses import replace
    traces = tb.traceset(
        [tb.trace(r, tb.collectives(4, group_size=4, last_state=tb.ENTERED), world_size=4)
         for r in (0, 1)], groups={"0": (0, 1, 2, 3)}, world_size=4)
    assert analyze(traces, annotators=()).root_cause.kind is FindingKind.MISSING_COLLECTIVE
    d = analyze(replace(traces, partial="host nodeA alone"), annotators=())
    assert d.root_cause is None and any("host nodeA alone" in n for n in d.notes)
    assert {s.rank: s.exit_detail for s in d.ranks}[3] == "on another host, not seen here"


def test_a_diagnosis_survives_json(scenario):
    _, traces = scenario
    d = analyze(traces, annotators=())
    back = Diagnosis.from_json(json.loads(d.to_json_text()))
    assert back is not None and back.to_json_text() == d.to_json_text()
    assert Diagnosis.from_json({"verdict": "nonsense"}) is None


def test_two_hosts_with_the_same_pid_do_not_collide(tb):
    from dataclasses import replace
    a, b = tb.trace(0, tb.collectives(2), host="nodeA"), tb.trace(1, tb.collectives(2), host="nodeB")
    b = replace(b, meta=replace(b.meta, pid=a.meta.pid), path=a.path.replace("node0", "nodeB"))
    u = union([tb.traceset([a], world_size=2), tb.traceset([b], world_size=2)])
    assert sorted(u.ranks) == [0, 1] and not u.problems
    d = analyze(u, annotators=())
    assert [(s.rank, s.host, s.pid) for s in d.ranks] == [(0, "nodeA", a.meta.pid),
                                                          (1, "nodeB", a.meta.pid)]
