"""Known-issue rules on synthetic findings and environments: the upstream issue when the library
version and its code match, the general fix for the mechanism otherwise, nothing for others."""

from __future__ import annotations

from nccl_doctor.diagnosis import Diagnosis, Finding, FindingKind, Severity, Verdict
from nccl_doctor.sections import StackClass
from nccl_doctor.analysis.calls.annotate import versions_of
from nccl_doctor.plugins.known_issues import annotate


def _diag(f: Finding, stacks: list[str] = (), ranks=(0, 1)) -> Diagnosis:
    classes = (StackClass(ranks=tuple(ranks), odd=False, frames=tuple(stacks),
                          sources=("py-spy",)),) if stacks else ()
    return Diagnosis(verdict=Verdict.HANG, findings=(f,), ranks=(), world_size=2,
                     stack_classes=classes)


def _mismatch(aspect: str = "shape", ops=("all_gather", "all_gather"),
              shapes=("float32[2,13,96]", "float32[2,14,96]"), call_path=()) -> Finding:
    """A collective_mismatch as analysis/what/mismatch.py writes one (sides with op and input)."""
    sides = [{"ranks": [r], "op": op, "value": op if aspect == "op" else shape, "input": shape,
              "callsite": "train.py:40"} for r, (op, shape) in enumerate(zip(ops, shapes))]
    return Finding(kind=FindingKind.COLLECTIVE_MISMATCH, severity=Severity.ERROR,
                   title="all_gather #12 of group 0: shapes differ", detail="", ranks=(0, 1),
                   hint="original", group="0", seq=12, op="all_gather", callsite="train.py:40",
                   call_path=tuple(call_path),
                   evidence={"aspect": aspect, "sides": sides}, root_cause=True)


def _frame(path: str, line: int, function: str) -> dict:
    return {"path": path, "line": line, "function": function}


CPO_STACK = ["train.py:40 <module>", ".venv/lib/python3.11/site-packages/trl/trainer/"
             "cpo_trainer.py:812 get_batch_loss_metrics",
             ".venv/lib/python3.11/site-packages/accelerate/utils/operations.py:380 gather"]


def known(d: Diagnosis) -> dict:
    return d.findings[0].evidence.get("known_issue")


def test_a_upstream_when_trl_is_affected_and_its_cpo_trainer_gathers():
    d = annotate(_diag(_mismatch(), CPO_STACK), {"trl": "0.16.1", "torch": "2.6.0"})
    k = known(d)
    assert k["rule"] == "A" and "#3068" in k["upstream"] and k["library"] == "trl 0.16.1"
    assert "v0.17.0" in d.findings[0].hint and "#3069" in d.findings[0].hint


def test_a_general_fix_when_trl_is_fixed_or_absent_or_elsewhere():
    for versions, stacks in (({"trl": "0.17.0"}, CPO_STACK), ({}, CPO_STACK),
                             ({"trl": "0.15.2"}, ["train.py:40 <module>"])):
        d = annotate(_diag(_mismatch(), stacks), versions)
        k = known(d)
        assert k["rule"] == "A" and "upstream" not in k, (versions, k)
        assert d.findings[0].hint.startswith("Each rank pads to its own length")


def test_b_upstream_for_sft_trainer_in_0_15_0_and_nccl_style_op_mismatch():
    stacks = ["train.py:9 <module>", "site-packages/trl/trainer/sft_trainer.py:480 compute_loss"]
    d = annotate(_diag(_mismatch("op", ("all_gather", "all_reduce"),
                                 ("float32[2,1,96]", "float32[1]")), stacks),
                 {"trl": "0.15.0"})
    assert known(d)["rule"] == "B" and "#2879" in known(d)["upstream"]
    assert "packing=True" in d.findings[0].hint


def test_c_node_seeding_upstream_with_ms_swift_and_general_without():
    f = Finding(kind=FindingKind.IDENTICAL_COMPLETIONS, severity=Severity.WARNING,
                title="all local ranks of each node sampled identical completions; completions "
                      "differ across nodes (4 of 4 generations)",
                detail="seeding: rank 0 ... site-packages/swift/trainers/rlhf_trainer/grpo.py",
                ranks=(0, 1, 2, 3))
    up = known(annotate(_diag(f), {"swift": "3.4.0"}))
    assert up["rule"] == "C" and "#3745" in up["upstream"]
    general = known(annotate(_diag(f), {}))
    assert general["rule"] == "C" and "global rank" in general["fix"]
    # identical completions of every rank alike is not the per-node mechanism
    everyone = Finding(kind=FindingKind.IDENTICAL_COMPLETIONS, severity=Severity.WARNING,
                       title="all 4 ranks sampled identical completions", detail="",
                       ranks=(0, 1, 2, 3))
    assert known(annotate(_diag(everyone), {})) is None


def test_d_rendezvous_stuck_rank():
    f = Finding(kind=FindingKind.MISSING_COLLECTIVE, severity=Severity.ERROR,
                title="barrier #2 of group 0: ranks 1, 2 entered it, rank 0 never did",
                detail="rank 0 is stuck outside any collective at openrlhf/utils/"
                       "distributed_util.py:45 in init_process_group: idle",
                ranks=(0,), op="barrier", evidence={"stuck": {"0": "idle"}}, root_cause=True)
    up = known(annotate(_diag(f), {"openrlhf": "0.6.1", "vllm": "0.8.2"}))
    assert up["rule"] == "D" and "#918" in up["upstream"]
    assert "VLLM_ENABLE_V1_MULTIPROCESSING=0" in up["fix"]
    plain = replace_detail(f, "rank 0 is stuck outside any collective at data.py:3 in next")
    assert known(annotate(_diag(plain), {"openrlhf": "0.6.1"})) is None


def replace_detail(f: Finding, detail: str) -> Finding:
    from dataclasses import replace

    return replace(f, detail=detail)


def test_e_generate_under_zero3():
    stacks = ["train.py:5 <module>", "site-packages/transformers/generation/utils.py:2400 "
              "generate", "site-packages/deepspeed/runtime/zero/stage3.py:90 fetch"]
    d = annotate(_diag(_mismatch("op", ("all_gather", "all_reduce")), stacks),
                 {"deepspeed": "0.16.0"})
    assert known(d)["rule"] == "E" and "synced_gpus=True" in d.findings[0].hint
    assert "#22231" in known(d)["upstream"]
    # without deepspeed: still the mechanism, the general fix
    assert "upstream" not in known(annotate(_diag(_mismatch("op", ("all_gather", "all_reduce")),
                                                  stacks), {}))


def test_a_matches_its_mechanism_not_an_op_name():
    """An all_reduce against an all_gather of small vectors (two actors out of step), a shape
    mismatch in the batch dimension or in two dimensions: gathers, but not padded logits."""
    for f in (_mismatch("op", ("all_reduce", "all_gather"), ("float32[4]", "float32[4]")),
              _mismatch("shape", shapes=("float32[3,7,96]", "float32[2,7,96]")),
              _mismatch("shape", shapes=("float32[2,13,96]", "float32[2,14,95]")),
              _mismatch("shape", shapes=("float32[13]", "float32[14]"))):
        assert known(annotate(_diag(f, CPO_STACK), {"trl": "0.16.1"})) is None, f.evidence
    # a padded 2-D tensor counts when logits or metrics are on its call path
    metrics = [_frame("/v/site-packages/trl/trainer/cpo_trainer.py", 839,
                      "get_batch_loss_metrics")]
    two_d = _mismatch("op", ("all_gather", "all_reduce"), ("float32[2,7]", "float32[1]"), metrics)
    assert known(annotate(_diag(two_d), {"trl": "0.16.1"}))["rule"] == "A"


def test_upstream_needs_the_library_file_on_the_call_path():
    """With a call path recorded, the library's file must be on it: trl's CPO trainer in a
    stack of some other rank, or the version alone, names no upstream issue."""
    on_path = [_frame("/v/site-packages/accelerate/utils/operations.py", 380, "gather"),
               _frame("/v/site-packages/trl/trainer/cpo_trainer.py", 839,
                      "get_batch_loss_metrics"), _frame("/job/train.py", 16, "<module>")]
    elsewhere = [_frame("/job/metrics.py", 3, "gather_all"), _frame("/job/train.py", 16, "main")]
    up = known(annotate(_diag(_mismatch(call_path=on_path)), {"trl": "0.16.1"}))
    assert up["rule"] == "A" and "#3068" in up["upstream"]
    general = known(annotate(_diag(_mismatch(call_path=elsewhere), CPO_STACK), {"trl": "0.16.1"}))
    assert general["rule"] == "A" and "upstream" not in general


def test_unrelated_findings_are_left_alone(tb):
    f = Finding(kind=FindingKind.COLLECTIVE_MISMATCH, severity=Severity.ERROR,
                title="broadcast #3: roots differ", detail="", ranks=(1,), hint="keep me",
                op="broadcast", evidence={"aspect": "root"})
    d = annotate(_diag(f), {"trl": "0.16.0"})
    assert d.findings[0].hint == "keep me" and known(d) is None
    traces = tb.traceset([tb.trace(0), tb.trace(1)])
    assert versions_of(traces) == {}


def test_from_a_synthetic_trace_and_its_environment(tb):
    """The whole path: a capture's shape mismatch on all_gather (the padded gather), the ranks'
    recorded versions, analysis, then the hang report with py-spy stacks in trl's CPO trainer."""
    from dataclasses import replace

    from nccl_doctor.analysis import analyze
    from nccl_doctor.location import Location
    from nccl_doctor.stacks.rank_stack import RankStack, ThreadStack
    from nccl_doctor.analysis.what.hang import hang_diagnosis

    base = tb.scenarios["shape_mismatch"]()
    traces = replace(base, ranks={
        r: replace(t, meta=replace(t.meta, versions={"trl": "0.16.0", "torch": "2.6.0"}))
        for r, t in base.ranks.items()})
    post_mortem = analyze(traces)
    assert known(post_mortem)["rule"] == "A" and "upstream" not in known(post_mortem)
    frames = (Location("/venv/lib/python3.11/site-packages/torch/distributed/"
                       "distributed_c10d.py", 4287, "wait"),
              Location("/venv/lib/python3.11/site-packages/trl/trainer/cpo_trainer.py", 812,
                       "get_batch_loss_metrics"),
              Location("/job/train.py", 40, "<module>"))
    stacks = {r: RankStack(r, 1000 + r, "py-spy", (ThreadStack(1, "MainThread", frames, True,
                                                                 True, True),))
              for r in traces.ranks}
    report = hang_diagnosis(post_mortem, post_mortem.root_cause, stacks, {},
                            versions_of(traces))
    k = known(report)
    assert k["rule"] == "A" and "#3068" in k["upstream"] and k["library"] == "trl 0.16.0"
