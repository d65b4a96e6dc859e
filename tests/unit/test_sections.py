"""The typed report sections (nccl_doctor/sections.py, finding_evidence.py): each reads back what
it writes, report.json keeps its keys, and garbage is refused."""

from __future__ import annotations

import json

import pytest

from nccl_doctor.diagnosis import Diagnosis, Finding, FindingKind, RankSummary, Severity, Verdict
from nccl_doctor.finding_evidence import (
    BY_KIND, ExitEvidence, GpuBusyEvidence, KnownIssue, MissingEvidence, StallEvidence,
    evidence_for)
from nccl_doctor.sections import (
    Branch, CallFrame, CaptureInfo, LastCollective, NodeState, Nodes, Ray, RayActor, RayGroup,
    StackClass)

BRANCH = Branch(path="/job/train.py", line=28, text="if rank == 0:", kind="if", function="main",
                ranks=(0,), skips=True, names=("rank",), culprit=True)


def _finding(kind: FindingKind, evidence: dict) -> Finding:
    return Finding(kind=kind, severity=Severity.ERROR, title="t", detail="d", ranks=(1,),
                   evidence=evidence)


def _diagnosis() -> Diagnosis:
    missing = _finding(FindingKind.MISSING_COLLECTIVE, {
        "waiting_ranks": [0], "missing_ranks": [1], "input": None, "blame": "branch",
        "instead": {"1": {"category": "compute", "detail": "x"}},
        "waiting_states": {"0": "in_flight"}, "your_line": None,
        "known_issue": {"rule": "A", "mechanism": "m", "fix": "f"}, "acme": [1, 2]})
    missing = Finding(**{**missing.__dict__, "branch": BRANCH, "root_cause": True,
                         "call_path": (CallFrame("/job/train.py", 16, "main"),
                                       CallFrame("/v/trl/t.py", 9, "f", "trl", "0.16.1"))})
    exited = _finding(FindingKind.RANK_EXITED, {"exit": "signal", "signal": "SIGKILL",
                                                "teardown": True})
    rank = RankSummary(
        rank=0, host="h", pid=7, state="blocked", exit_code=None, signal=None,
        exit_detail="blocked", stack_summary=None,
        last_collective=LastCollective(group="0", seq=3, op="all_reduce", state="entered",
                                       callsite="train.py:9", input="f32[4]", source="c10d"),
        capture=CaptureInfo(file="rank0.ndcap", events=4, complete=True, integrity="whole"))
    bare = RankSummary(rank=1, host="", pid=0, state="no_capture", exit_code=None, signal=None,
                       exit_detail="not recorded", last_collective=None, stack_summary=None,
                       capture=None)
    return Diagnosis(
        verdict=Verdict.HANG, findings=(missing, exited), ranks=(rank, bare), world_size=2,
        stack_classes=(StackClass(ranks=(0,), odd=True, frames=("a.py:1 main", "b.py:2 f"),
                                  tail="b.py:2 f", sources=("py-spy",)),),
        nodes=Nodes(diagnosed_by_host="a", diagnosed_by_node_rank=0, coordinator="a:29500",
                    rendezvous="--rdzv", expected=2,
                    nodes=(NodeState("a", 0, (0,), "leader", "ok"),
                           NodeState("b", 1, (1,), "follower", "lost")),
                    authenticated=True, key="the key in NCCL_DOCTOR_FEDERATION_KEY",
                    missing=0),
        ray=Ray(actors={0: RayActor("Trainer", "0a0b0c0d0000", "", "a")},
                groups={"0": RayGroup((0, 1), "the world")}))


def test_the_report_reads_back_what_it_wrote() -> None:
    d = _diagnosis()
    text = d.to_json_text()
    back = Diagnosis.from_json(json.loads(text))
    assert back is not None and back.to_json_text() == text
    assert back.findings[0].evidence == d.findings[0].evidence
    assert back.findings[0].branch == BRANCH and back.findings[0].call_path == d.findings[0].call_path
    assert back.ranks == d.ranks and back.nodes == d.nodes and back.ray == d.ray
    assert back.stack_classes == d.stack_classes


def test_the_json_keeps_report_json_keys() -> None:
    raw = _diagnosis().to_json()
    ev = raw["findings"][0]["evidence"]
    assert ev["your_line"] is None and ev["acme"] == [1, 2]  # (another package's key, kept)
    assert ev["known_issue"] == {"rule": "A", "mechanism": "m", "fix": "f"}
    assert raw["findings"][1]["evidence"] == {"exit": "signal", "signal": "SIGKILL",
                                              "teardown": True}
    assert raw["ranks"][1]["capture"] == {} and raw["ranks"][1]["last_collective"] is None
    assert raw["ray"]["actors"]["0"]["class"] == "Trainer"
    assert raw["nodes"]["diagnosed_by"] == {"host": "a", "node_rank": 0}
    assert "missing" not in raw["nodes"] and raw["nodes"]["authenticated"] is True
    assert raw["nodes"]["key"] == "the key in NCCL_DOCTOR_FEDERATION_KEY"
    assert raw["findings"][0]["branch"]["culprit"] is True


def test_a_mapping_given_is_parsed_into_the_kinds_evidence() -> None:
    f = _diagnosis().findings[0]
    assert isinstance(f.evidence, MissingEvidence)
    assert f.evidence.waiting_states == {0: "in_flight"} and f.absent == (1,)
    assert f.evidence.known_issue == KnownIssue(rule="A", mechanism="m", fix="f")
    assert f.evidence.extra == {"acme": [1, 2]}
    assert f.evidence["missing_ranks"] == [1]  # (the JSON view annotators read)
    annotated = Finding(**{**f.__dict__, "evidence": {**f.evidence, "x": 1}})
    assert isinstance(annotated.evidence, MissingEvidence) and annotated.evidence.extra["x"] == 1
    assert f.branch_line.endswith("train.py:28  if rank == 0:  (it kept rank 0 out of the "
                                  "call the others made)")


def test_every_kind_has_its_evidence_class() -> None:
    assert set(BY_KIND) == {k.value for k in FindingKind}
    assert isinstance(evidence_for("stall", {"class": "comm", "waited_s": 3}), StallEvidence)
    assert evidence_for("stall", {"class": "comm", "waited_s": 3}).waited_s == 3.0
    spin = {"gpu": 0, "since": 1.0, "placed_by": "env", "util": 100, "power_w": 80.0,
            "power_limit_w": 400.0, "power_share": 0.2, "link_kbs": 0.0, "samples": 5,
            "span_s": 9.0}
    ev = evidence_for("gpu_busy_hang", {"waiting_for": [1], "spinning": {"0": spin}})
    assert isinstance(ev, GpuBusyEvidence) and ev.spinning[0].span_s == 9.0
    assert ev.to_json() == {"waiting_for": [1], "spinning": {"0": spin}}


def test_a_value_of_the_wrong_type_is_kept_as_it_came() -> None:
    ev = evidence_for("rank_exited", {"exit": "exception", "exit_code": "one", "pids": 3})
    assert isinstance(ev, ExitEvidence) and ev.exit_code is None
    assert ev.extra == {"exit_code": "one", "pids": 3}
    assert ev.to_json()["exit_code"] == "one"


@pytest.mark.parametrize("garbage", [
    {}, {"verdict": "maybe"}, {"verdict": "hang", "ranks": [{"pid": 1}]},
    {"verdict": "hang", "ranks": ["x"]}, {"verdict": "hang", "nodes": [1]},
    {"verdict": "hang", "ray": {"actors": {"x": {}}}},
    {"verdict": "hang", "stack_classes": [{"ranks": "0"}]},
    {"verdict": "hang", "ranks": [{"rank": 0, "capture": {"events": "many"}}]},
])
def test_garbage_is_not_a_diagnosis(garbage: dict) -> None:
    assert Diagnosis.from_json(garbage) is None


def test_a_bad_finding_is_left_out() -> None:
    raw = _diagnosis().to_json()
    raw["findings"].append({"kind": "missing_collective", "severity": "error", "title": "t",
                            "evidence": [1]})
    back = Diagnosis.from_json(raw)
    assert back is not None and len(back.findings) == 2
