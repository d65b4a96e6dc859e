"""Roles (analysis/who/roles.py): ranks are compared with the peers of their role only. A synthetic
pipeline of 2 stages x 2 replicas (ranks 0, 1: replica 0's stages 0 and 1; ranks 2, 3: replica
1's), each step: stage 0 works and sends to stage 1, which works and sends back; each stage
all-reduces over its data-parallel group, then every rank over the world group."""

from __future__ import annotations

from dataclasses import replace

from nccl_doctor.analysis import analyze
from nccl_doctor.analysis.slow.busy import busy_table
from nccl_doctor.analysis.slow.lateness import arrivals
from nccl_doctor.analysis.slow.pipeline_balance import detect_pipeline_imbalance
from nccl_doctor.analysis.who.roles import peer_classes, role_text, roles, symmetric
from nccl_doctor.analysis.slow.straggler import detect_straggler
from nccl_doctor.capture.roles import MeshPlace, Role, noted_role
from nccl_doctor.diagnosis import FindingKind, RankSummary, Severity, Verdict
from nccl_doctor.model import EventKind

MS = 1_000_000
STEP_NS = 400 * MS
GROUPS = {"0": (0, 1, 2, 3), "1": (0, 2), "2": (1, 3), "3": (0, 1), "4": (2, 3)}
DP = {0: "1", 1: "2"}  # stage -> its data-parallel group
PP = {0: "3", 1: "4"}  # replica -> its pipeline group


def _notes(rank: int) -> tuple[dict, ...]:
    replica, stage = divmod(rank, 2)
    return (
        {"note": "role", "what": "mesh", "dims": ["dp", "pp"], "shape": [2, 2],
         "coords": [replica, stage], "groups": [DP[stage], PP[replica]], "named": True},
        {"note": "role", "what": "stage", "stage": stage, "num_stages": 2,
         "group": PP[replica], "group_rank": stage, "group_size": 2},
    )


def pipeline(tb, *, work_ms=(10, 200), slow_ms=None, score_ms=60, steps=8, noted=True,
             p2p=True):
    """The job's captures. ``work_ms``: each stage's work per step; ``slow_ms``: rank -> more
    work before its step; ``score_ms``: what the last stage does after its step (it arrives
    late at the world all_reduce by design)."""
    slow_ms = slow_ms or {}
    events: dict[int, list] = {r: [] for r in range(4)}

    def add(rank, op, group, seq, enter, exit_, kind=EventKind.COLLECTIVE, peer=-1, line=50):
        e = tb.event(len(events[rank]) + 1, op, group, seq=seq, kind=kind, peer=peer,
                     group_size=len(GROUPS[group]), t_enter_ns=enter, line=line)
        events[rank].append(replace(e, t_exit_ns=exit_))

    for k in range(steps):
        t = tb.T0 + k * STEP_NS
        ready = {}
        for replica in (0, 1):
            first, last = 2 * replica, 2 * replica + 1
            sent = t + (work_ms[0] + slow_ms.get(first, 0)) * MS
            done = sent + MS + (work_ms[1] + slow_ms.get(last, 0)) * MS
            back = done + MS
            if p2p:
                add(first, "send", PP[replica], -1, sent, sent + MS, EventKind.P2P, last, 30)
                add(last, "recv", PP[replica], -1, t, sent + MS, EventKind.P2P, first, 31)
                add(last, "send", PP[replica], -1, done, back, EventKind.P2P, first, 32)
                add(first, "recv", PP[replica], -1, sent + MS, back, EventKind.P2P, last, 33)
            ready[first] = ready[last] = back
        left = {}
        for stage in (0, 1):  # the stage's data-parallel all_reduce: ends once both came
            pair = (stage, stage + 2)
            end = max(ready[r] for r in pair) + MS
            for r in pair:
                add(r, "all_reduce", DP[stage], k + 1, ready[r], end, line=40)
                left[r] = end + (score_ms * MS + r * MS // 2 if stage == 1 else 0)
        end = max(left.values()) + MS
        for r in range(4):  # the world all_reduce (the loss)
            add(r, "all_reduce", "0", k + 1, left[r], end, line=41)
    traces = []
    for r in range(4):
        trace = tb.trace(r, events[r], tb.clean(), world_size=4)
        traces.append(replace(trace, notes=_notes(r)) if noted else trace)
    return tb.traceset(traces, groups=GROUPS)


def test_a_ranks_role_is_read_from_its_notes_and_said_in_the_report(tb):
    role = noted_role(_notes(3))
    assert role == Role(meshes=(MeshPlace(("dp", "pp"), (2, 2), (1, 1), ("2", "4")),),
                        stages=(1,), num_stages=2, pipeline_group="4")
    assert noted_role([{"note": "role", "what": "stage", "stage": 5, "num_stages": 2}]) is None
    assert noted_role([{"note": "group", "name": "0"}]) is None
    traces = pipeline(tb)
    assert roles(traces)[3].groups == ("0", "2", "4")
    assert role_text(roles(traces)[3]) == "stage 1 of 2, pp=1"
    d = analyze(traces, annotators=())
    ranks = {r["rank"]: r for r in d.to_json()["ranks"]}
    assert ranks[2]["role"]["stages"] == [0] and ranks[2]["role"]["meshes"][0]["coords"] == [1, 0]
    assert ranks[2]["role"]["inferred"] is False
    again = RankSummary.from_json(ranks[2])
    assert again.role == roles(traces)[2]


def test_mesh_dims_that_do_the_same_work_do_not_separate_roles():
    assert symmetric("dp") and symmetric("dp_shard_cp") and symmetric("tp")
    assert symmetric("etp") and symmetric("efsdp") and symmetric("dp_shard_in_ep")
    assert not symmetric("pp") and not symmetric("stage")


def test_the_last_stage_arriving_last_by_design_is_not_a_straggler(tb):
    traces = pipeline(tb)
    # the world group's calls are compared within each stage: ranks 0, 2 and ranks 1, 3
    assert {a.peers for a in arrivals(traces).calls if a.group == "0"} == {(0, 2), (1, 3)}
    assert detect_straggler(traces) == []
    # the same captures with nothing that tells the stages apart (no notes, no sends): every
    # rank is a peer of every other, and the last stage's rank 3 reads as a straggler
    blind = pipeline(tb, noted=False, p2p=False)
    (f,) = detect_straggler(blind)
    assert f.ranks == (3,)


def test_without_notes_the_stages_are_inferred_from_the_sends_and_receives(tb):
    traces = pipeline(tb, noted=False)
    found = roles(traces)
    assert [(found[r].stages, found[r].inferred) for r in range(4)] == [
        ((0,), True), ((1,), True), ((0,), True), ((1,), True)]
    assert found[0].pipeline_group == "p2p:0-1" and found[3].pipeline_group == "p2p:2-3"
    assert peer_classes(traces, (0, 1, 2, 3)) == [(0, 2), (1, 3)]
    assert detect_straggler(traces) == []
    # a one-off exchange is not a pipeline: ranks that sent each other fewer than MIN_P2P
    # messages are one role
    few = pipeline(tb, noted=False, steps=8)
    few = replace(few, ranks={r: replace(t, events=tuple(
        e for e in t.events if e.kind is not EventKind.P2P or e.idx <= 4))
        for r, t in few.ranks.items()})
    assert peer_classes(few, (0, 1, 2, 3)) == [(0, 1, 2, 3)]


def test_a_straggler_within_a_role_is_named_and_the_ranks_it_holds_back_are_not(tb):
    traces = pipeline(tb, work_ms=(100, 100), slow_ms={2: 150})
    (f,) = detect_straggler(traces)
    assert f.ranks == (2,)
    assert "Rank 2 (stage 0 of 2, pp=0) is compared with the ranks of its role only: rank 0" \
        in f.detail
    # rank 3 (stage 1 of rank 2's replica) is late among its own peers, waiting for rank 2
    assert "Rank 3 arrives late too" in f.detail and "waits for rank 2" in f.detail
    assert detect_pipeline_imbalance(traces) == []  # replica 0 is balanced: not the pipeline's


def test_a_slower_stage_is_an_info_finding_with_its_cost_never_suspect(tb):
    traces = pipeline(tb)
    busy = busy_table(traces)
    assert busy[0].steps == 7 and abs(busy[0].step_s - 0.4) < 0.001
    (f,) = detect_pipeline_imbalance(traces)
    assert f.kind is FindingKind.PIPELINE_IMBALANCE and f.severity is Severity.INFO
    assert f.ranks == (1, 3) and f.evidence.stage == (1,) and f.evidence.replicas == 2
    # stage 1 works 200 ms + 60 ms scoring, stage 0 10 ms: 250 ms more of a 400 ms step
    assert abs(f.evidence.excess_per_step_s - 0.250) < 0.01, f.evidence
    assert abs(f.evidence.idle_share - 0.625) < 0.03, f.evidence
    assert f.title.startswith("pipeline stage 1 takes 25") and "more per step than stage 0" \
        in f.title and "% of each step idle on the other stages" in f.title
    d = analyze(traces, annotators=())
    assert d.verdict is Verdict.OK
    assert [x.kind for x in d.findings] == [FindingKind.PIPELINE_IMBALANCE]
    stages = d.to_json()["findings"][0]["evidence"]["stages"]
    assert set(stages) == {"0", "1"} and abs(stages["1"] - stages["0"] - 0.251) < 0.002
    assert detect_pipeline_imbalance(pipeline(tb, work_ms=(100, 100), score_ms=0)) == []


def test_empty_and_plain_jobs_have_no_roles_to_compare(tb):
    assert detect_pipeline_imbalance(tb.scenarios["empty"]()) == []
    clean = tb.scenarios["clean"]()
    assert detect_pipeline_imbalance(clean) == []
    assert peer_classes(clean, (0, 1)) == [(0, 1)]
    assert all(not r.known and r.inferred for r in roles(clean).values())
    assert "role" not in analyze(clean, annotators=()).to_json()["ranks"][0]
