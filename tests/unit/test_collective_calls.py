"""The catalog of collective library calls (plugins/collective_calls.json): each family matched on
synthetic findings (call paths, the ranks elsewhere, py-spy stacks), version ranges, the ZeRO-3
generate condition, bad entries skipped with a reason, a third-party catalog through the entry
points (docs/plugins.md's example, verbatim), and every entry's function checked against the
libraries' real source."""

from __future__ import annotations

import ast
import glob
import importlib
import json
import os
import re
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from nccl_doctor.analysis.calls import annotate as annotators
from nccl_doctor.diagnosis import Diagnosis, Finding, FindingKind, Severity, Verdict
from nccl_doctor.sections import StackClass
from nccl_doctor.plugins import collective_calls as cc
from nccl_doctor.plugins.known_issues import annotate as known_issues

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs" / "plugins.md"
FIXTURE = ROOT / "tests" / "fixtures" / "collective_calls_sources.json"
SITE = "/venv/lib/python3.11/site-packages/"


def _frame(path: str, line: int, function: str, version: str | None = None) -> dict:
    package = path.split("site-packages/")[1].split("/")[0] if "site-packages/" in path else None
    return {"path": path, "line": line, "function": function, "package": package,
            "version": version}


def _missing(call_path=(), instead=None, hint="old hint", ranks=(1,), waiting=(0,),
             kind=FindingKind.MISSING_COLLECTIVE, evidence=None) -> Finding:
    """A missing_collective as analysis/what/missing.py writes one: the call path is the waiting
    ranks', ``instead`` says where each missing rank was."""
    ev = {"waiting_ranks": list(waiting), "missing_ranks": list(ranks), "input": "float32[8]"}
    if instead is not None:
        ev["instead"] = instead
    return Finding(kind=kind, severity=Severity.ERROR,
                   title="all_gather #7 of group 0: rank 0 entered it, rank 1 never did",
                   detail="rank 0 called all_gather(float32[8]) at train.py:20.", ranks=ranks,
                   hint=hint, group="0", seq=7, op="all_gather", call_path=tuple(call_path),
                   evidence={**ev, **(evidence or {})}, root_cause=True)


def _diag(*findings: Finding, stacks: list[tuple[list[int], list[str]]] = ()) -> Diagnosis:
    classes = tuple(StackClass(ranks=tuple(ranks), odd=False, frames=tuple(frames),
                               sources=("py-spy",)) for ranks, frames in stacks)
    return Diagnosis(verdict=Verdict.HANG, findings=findings, ranks=(), world_size=2,
                     stack_classes=classes)


def calls(d: Diagnosis, i: int = 0) -> list[dict]:
    return list(d.findings[i].evidence.get("collective_calls") or [])


EVALUATE_PATH = [
    _frame(SITE + "accelerate/utils/operations.py", 437, "gather", "1.15.0"),
    _frame(SITE + "accelerate/accelerator.py", 3160, "Accelerator.gather_for_metrics", "1.15.0"),
    _frame(SITE + "transformers/trainer.py", 3021, "Trainer.evaluation_loop", "5.24.0"),
    _frame(SITE + "transformers/trainer.py", 2871, "Trainer.evaluate", "5.24.0"),
    _frame("/job/train.py", 40, "main"),
]


def test_the_shipped_catalog_parses_whole():
    catalog = cc.builtin_catalog()
    assert catalog.skipped == ()
    ids = [e.id for e in catalog.entries]
    assert len(ids) == len(set(ids)) == 22
    assert {e.packages[0] for e in catalog.entries} == {
        "transformers", "accelerate", "torch", "deepspeed", "lightning"}


def test_trainer_evaluate_on_the_waiting_ranks_call_path():
    d = cc.annotate(_diag(_missing(EVALUATE_PATH)), {"transformers": "5.24.0"})
    f = d.findings[0]
    found = calls(d)
    # innermost first; the outermost, the call the rank's code made, holds the others
    assert [r["call"] for r in found] == ["gather", "Accelerator.gather_for_metrics",
                                          "Trainer.evaluate"]
    evaluate = found[-1]
    assert evaluate == {
        "id": "transformers-trainer-evaluate", "ranks": [0], "call": "Trainer.evaluate",
        "package": "transformers", "version": "5.24.0",
        "where": SITE + "transformers/trainer.py:2871", "what": evaluate["what"],
        "fix": evaluate["fix"], "when": None, "seen_in": "call path", "within": None}
    assert [r["within"] for r in found[:2]] == ["Trainer.evaluate"] * 2
    assert f.detail.splitlines()[-1] == (
        "`Trainer.evaluate` (transformers 5.24.0) is collective: it runs the evaluation loop on "
        "every rank and gathers each batch's losses, logits and labels across the ranks with "
        "accelerator.gather_for_metrics (rank 0's call path passes through it at "
        "transformers/trainer.py:2871; inside it: `Accelerator.gather_for_metrics`, `gather`).")
    assert len(f.detail.splitlines()) == 2  # one line for the call, none for those inside it
    assert f.hint.startswith("Call trainer.evaluate() on every rank, or")
    assert "control.should_evaluate" in f.hint and f.hint.endswith(" old hint")


def test_wait_for_everyone_where_a_missing_rank_was_instead():
    instead = {"1": {"category": "blocked", "detail": "rank 1 is blocked in barrier #9",
                     "call_path": [_frame(SITE + "accelerate/state.py", 412,
                                          "PartialState.wait_for_everyone"),
                                   _frame(SITE + "accelerate/utils/other.py", 376,
                                          "wait_for_everyone"),
                                   _frame(SITE + "accelerate/accelerator.py", 3310,
                                          "Accelerator.wait_for_everyone"),
                                   _frame("/job/train.py", 55, "main")]}}
    d = cc.annotate(_diag(_missing([_frame("/job/train.py", 20, "main")], instead)), {})
    (record,) = calls(d)  # one entry, its outermost frame
    assert record["call"] == "Accelerator.wait_for_everyone" and record["ranks"] == [1]
    assert record["version"] is None and record["where"].endswith("accelerator.py:3310")
    assert ("`Accelerator.wait_for_everyone` (accelerate, version not recorded) is collective: it "
            "is a barrier") in d.findings[0].detail
    assert "rank 1's call path passes through it at accelerate/accelerator.py:3310" in \
        d.findings[0].detail
    assert d.findings[0].hint.startswith("Call wait_for_everyone() on every rank")


def test_deepspeed_save_checkpoint_on_a_mismatch_side():
    sides = [{"ranks": [0], "op": "barrier", "value": "barrier", "call_path": [
                 _frame(SITE + "deepspeed/comm/comm.py", 117, "barrier", "0.19.8"),
                 _frame(SITE + "deepspeed/runtime/engine.py", 4900,
                        "DeepSpeedEngine.save_checkpoint", "0.19.8"),
                 _frame("/job/train.py", 80, "main")]},
             {"ranks": [1], "op": "all_reduce", "value": "all_reduce", "call_path": [
                 _frame(SITE + "deepspeed/runtime/engine.py", 2380,
                        "DeepSpeedEngine.allreduce_gradients", "0.19.8"),
                 _frame("/job/train.py", 70, "main")]}]
    f = Finding(kind=FindingKind.COLLECTIVE_MISMATCH, severity=Severity.ERROR,
                title="barrier / all_reduce #40 of group 0: ops differ", detail="", ranks=(1,),
                hint="old", op="all_reduce", evidence={"aspect": "op", "sides": sides})
    d = cc.annotate(_diag(f), {"deepspeed": "0.19.8"})
    (record,) = calls(d)
    assert (record["id"], record["ranks"], record["version"]) == (
        "deepspeed-save-checkpoint", [0], "0.19.8")
    assert d.findings[0].hint.startswith("Call engine.save_checkpoint(...) on every rank")


def test_lightning_strategies_by_any_class_and_both_package_names():
    for package, path in (("lightning", "lightning/pytorch/strategies/ddp.py"),
                          ("pytorch_lightning", "pytorch_lightning/strategies/fsdp.py")):
        cls = "DDPStrategy" if package == "lightning" else "FSDPStrategy"
        path_ = [_frame(SITE + path, 302, f"{cls}.barrier", "2.6.6"),
                 _frame("/job/callbacks.py", 12, "on_train_epoch_end")]
        (record,) = calls(cc.annotate(_diag(_missing(path_)), {}))
        assert (record["call"], record["package"], record["version"]) == (
            f"{cls}.barrier", package, "2.6.6")
    # a method of that name outside the strategies, or another method there: no
    for frame in (_frame(SITE + "lightning/pytorch/trainer/trainer.py", 9, "Trainer.barrier"),
                  _frame(SITE + "lightning/pytorch/strategies/ddp.py", 9, "DDPStrategy.setup")):
        assert calls(cc.annotate(_diag(_missing([frame])), {})) == []


def test_lightning_log_says_when_it_is_collective():
    path_ = [_frame(SITE + "lightning/pytorch/strategies/ddp.py", 366, "DDPStrategy.reduce"),
             _frame(SITE + "lightning/pytorch/trainer/connectors/logger_connector/result.py", 225,
                    "_ResultMetric.forward"),
             _frame(SITE + "lightning/pytorch/core/module.py", 531, "LightningModule.log"),
             _frame("/job/model.py", 30, "Model.validation_step")]
    d = cc.annotate(_diag(_missing(path_)), {"lightning": "2.6.6"})
    assert [r["call"] for r in calls(d)] == ["DDPStrategy.reduce", "LightningModule.log"]
    assert ("`LightningModule.log` (lightning 2.6.6) is collective when sync_dist=True: the value "
            "is all-reduced") in d.findings[0].detail


DCP_STACK = [
    "train.py:12 <module>", "train.py:9 main",
    SITE + "torch/distributed/checkpoint/logger.py:87 "
    "_dcp_method_logger.<locals>.decorator.<locals>.wrapper",
    SITE + "torch/distributed/checkpoint/state_dict_saver.py:175 save",
    SITE + "torch/distributed/checkpoint/state_dict_saver.py:487 _save_state_dict",
    SITE + "torch/distributed/checkpoint/utils.py:200 _DistWrapper.reduce_scatter",
    SITE + "torch/distributed/distributed_c10d.py:3100 all_gather_object",
]


def test_dcp_save_is_seen_in_the_stacks_only():
    """Call paths never hold torch's frames: DCP's save shows in the py-spy stacks of the ranks
    the finding is about (not of others)."""
    d = cc.annotate(_diag(_missing([_frame("/job/train.py", 9, "main")]),
                          stacks=[([0], DCP_STACK), ([5], DCP_STACK),
                                  ([1], ["train.py:12 <module>", "train.py:30 main"])]),
                    {"torch": "2.13.0+cpu"})
    (record,) = calls(d)
    assert (record["call"], record["ranks"], record["version"], record["seen_in"]) == (
        "save", [0], "2.13.0+cpu", "stack")
    assert record["where"] == SITE + "torch/distributed/checkpoint/state_dict_saver.py:175"
    assert "rank 0's stack is in it at torch/distributed/checkpoint/state_dict_saver.py:175" in \
        d.findings[0].detail


def test_bare_function_names_from_an_in_rank_stack_dump():
    """Python 3.10 and the in-rank dump record co_name: the qualname's last part matches, in the
    entry's files only."""
    stack = ["train.py:3 <module>", SITE + "lightning/pytorch/trainer/trainer.py:1465 "
             "save_checkpoint", SITE + "lightning/pytorch/strategies/ddp.py:302 barrier"]
    d = cc.annotate(_diag(_missing(), stacks=[([0, 1], stack)]), {})
    assert [(r["call"], r["ranks"], r["within"]) for r in calls(d)] == [
        ("barrier", [0, 1], "Trainer.save_checkpoint"), ("Trainer.save_checkpoint", [0, 1], None)]
    assert "ranks 0, 1's stacks are in it at lightning/pytorch/trainer/trainer.py:1465" in \
        d.findings[0].detail
    elsewhere = ["train.py:3 <module>", "/job/utils.py:8 save_checkpoint"]
    assert calls(cc.annotate(_diag(_missing(), stacks=[([0], elsewhere)]), {})) == []


def test_a_version_outside_the_range_does_not_match():
    path_ = [_frame(SITE + "accelerate/accelerator.py", 3160, "Accelerator.gather_for_metrics")]
    assert [r["id"] for r in calls(cc.annotate(_diag(_missing(path_)), {"accelerate": "1.15.0"}))
            ] == ["accelerate-gather-for-metrics"]
    assert calls(cc.annotate(_diag(_missing(path_)), {"accelerate": "0.11.0"})) == []
    # the frame's own recorded version comes before the job's
    own = [dict(path_[0], package="accelerate", version="0.11.2")]
    assert calls(cc.annotate(_diag(_missing(own)), {"accelerate": "1.15.0"})) == []
    # an upper bound: first_not is excluded
    mine = cc.catalog_annotator([{"id": "x", "package": "acme", "function": "sync",
                                  "paths": ["acme/"], "versions": [None, "2.0"],
                                  "what": "it syncs", "fix": "sync everywhere"}])
    frame = [_frame(SITE + "acme/m.py", 1, "sync")]
    assert calls(mine(_diag(_missing(frame)), {"acme": "1.9.9"}))
    assert not calls(mine(_diag(_missing(frame)), {"acme": "2.0"}))
    assert calls(mine(_diag(_missing(frame)), {"acme": "unknown"}))  # no number: not recorded


def test_an_unknown_version_matches_and_says_so():
    d = cc.annotate(_diag(_missing([dict(EVALUATE_PATH[3], version=None)])), {})
    (record,) = calls(d)
    assert record["version"] is None
    assert "`Trainer.evaluate` (transformers, version not recorded) is collective" in \
        d.findings[0].detail


GENERATE = [SITE + "transformers/generation/utils.py:2700 GenerationMixin.generate",
            SITE + "transformers/generation/utils.py:3240 GenerationMixin._sample",
            SITE + "transformers/models/llama/modeling_llama.py:400 LlamaForCausalLM.forward"]


def test_generate_only_when_the_model_is_sharded():
    zero3 = ["train.py:5 <module>", *GENERATE,
             SITE + "deepspeed/runtime/zero/parameter_offload.py:470 "
             "DeepSpeedZeRoOffload._pre_forward_module_hook",
             SITE + "deepspeed/runtime/zero/partitioned_param_coordinator.py:300 "
             "PartitionedParameterCoordinator.fetch_sub_module"]
    d = cc.annotate(_diag(_missing(), stacks=[([0], zero3)]), {"transformers": "5.24.0"})
    (record,) = calls(d)
    assert record["call"] == "GenerationMixin.generate" and record["ranks"] == [0]
    assert "is collective when the model is sharded (DeepSpeed ZeRO-3, FSDP)" in \
        d.findings[0].detail
    assert "synced_gpus=True" in d.findings[0].hint
    fsdp = ["train.py:5 <module>", *GENERATE, SITE + "torch/distributed/fsdp/_fully_shard/"
            "_fsdp_state.py:230 FSDPState._pre_forward"]
    assert calls(cc.annotate(_diag(_missing(), stacks=[([0], fsdp)]), {}))
    # generate on an unsharded model, or ZeRO-3 frames on another rank's stack: no
    assert calls(cc.annotate(_diag(_missing(), stacks=[([0], ["train.py:5 <module>", *GENERATE])]),
                             {})) == []
    apart = [([0], ["train.py:5 <module>", *GENERATE]), ([1], ["train.py:5 <module>", zero3[-1]])]
    assert calls(cc.annotate(_diag(_missing(), stacks=apart), {})) == []


def test_a_bad_entry_is_skipped_with_its_reason_never_raised():
    good = {"id": "ok", "package": "acme", "function": "Bank.sync", "paths": ["acme/bank.py"],
            "what": "it all-reduces", "fix": "sync on every rank"}
    bad = [
        {k: v for k, v in good.items() if k != "fix"} | {"id": "no-fix"},
        good | {"id": "bad-versions", "versions": ["2.0", "1.0"]},
        good | {"id": "typo", "wiht": ["x/"]},
        good | {"id": "bad-function", "function": "Bank..sync"},
        good | {"id": "empty-paths", "paths": []},
        good,  # a second "ok"
        "not an object",
    ]
    catalog = cc.compile_catalog([good, *bad])
    assert [e.id for e in catalog.entries] == ["ok"]
    assert catalog.skipped == (
        "entry 2 ('no-fix') skipped: missing fix",
        "entry 3 ('bad-versions') skipped: versions ['2.0', '1.0'] is an empty range",
        "entry 4 ('typo') skipped: unknown field 'wiht'",
        "entry 5 ('bad-function') skipped: function has 'Bank..sync', which is not a valid name",
        "entry 6 ('empty-paths') skipped: paths must be a string or a non-empty list of strings",
        "entry 7 ('ok') skipped: a second entry with this id",
        "entry 8 skipped: an entry is a JSON object, not str",
    )
    mine = cc.catalog_annotator([good, *bad], name="acme")
    d = mine(_diag(_missing([_frame(SITE + "acme/bank.py", 3, "Bank.sync")])), {})
    assert [r["id"] for r in calls(d)] == ["ok"]
    assert "collective-call catalog (acme): entry 2 ('no-fix') skipped: missing fix" in d.notes
    assert len(d.notes) == 7
    assert mine(d, {}).notes == d.notes  # said once
    for text in ("{not json", '{"entries": 3}', "[]"):
        catalog = cc.read_catalog(text)
        assert catalog.entries == () and len(catalog.skipped) == (0 if text == "[]" else 1)
    missing_file = cc.catalog_annotator(ROOT / "no-such-catalog.json", name="gone")
    (note,) = missing_file(_diag(), {}).notes
    assert note.startswith("collective-call catalog (gone): ") and "could not be read" in note
    assert note.endswith(": no entry applied")


def test_findings_not_about_diverged_ranks_are_left_alone():
    for kind in (FindingKind.STRAGGLER, FindingKind.IDENTICAL_COMPLETIONS,
                 FindingKind.SHARED_RNG_STATE, FindingKind.DEGENERATE_SIGNAL):
        f = _missing(EVALUATE_PATH, kind=kind)
        assert cc.annotate(_diag(f), {}).findings[0] == f


def test_the_fix_leads_only_where_calling_it_everywhere_is_the_fix():
    """A crash or a stuck transport inside Trainer.evaluate: the detail says what the call is,
    the hint stays the crash's; an upstream known issue's fix keeps the lead too."""
    f = Finding(kind=FindingKind.RANK_EXITED, severity=Severity.ERROR, title="rank 1 exited",
                detail="rank 1 was killed (OOM).", ranks=(1,), hint="fix the crash",
                call_path=tuple(EVALUATE_PATH))
    d = cc.annotate(_diag(f), {})
    assert d.findings[0].hint == "fix the crash" and calls(d)[-1]["ranks"] == [1]
    assert "`Trainer.evaluate`" in d.findings[0].detail
    stall = replace(_missing(EVALUATE_PATH, kind=FindingKind.STALL),
                    evidence={"class": "compute", "waited_s": 300.0})
    d = cc.annotate(_diag(stall), {})
    assert d.findings[0].hint.startswith("Call trainer.evaluate()")
    assert "a waiting rank's call path passes through it" in d.findings[0].detail
    zero3 = ["train.py:5 <module>", *GENERATE,
             SITE + "deepspeed/runtime/zero/stage3.py:90 fetch"]
    mismatch = Finding(kind=FindingKind.COLLECTIVE_MISMATCH, severity=Severity.ERROR,
                       title="all_gather / all_reduce #3 of group 0: ops differ", detail="",
                       ranks=(1,), hint="old", op="all_gather",
                       evidence={"aspect": "op", "sides": [
                           {"ranks": [0], "op": "all_gather", "value": "all_gather"},
                           {"ranks": [1], "op": "all_reduce", "value": "all_reduce"}]})
    d = known_issues(_diag(mismatch, stacks=[([0, 1], zero3)]), {"deepspeed": "0.19.8"})
    assert d.findings[0].evidence["known_issue"]["upstream"]
    upstream_hint = d.findings[0].hint
    d = cc.annotate(d, {"deepspeed": "0.19.8"})
    assert calls(d)[0]["call"] == "GenerationMixin.generate"
    assert d.findings[0].hint == upstream_hint


def test_annotating_twice_changes_nothing_more():
    once = cc.annotate(_diag(_missing(EVALUATE_PATH)), {})
    assert cc.annotate(once, {}) == once




def test_the_docs_example_catalog_plugin_through_the_entry_points(site):
    block = re.search(r"```python\n(# acme_calls\.py\n.*?)```", DOCS.read_text(), re.S)
    assert block, "docs/plugins.md's catalog plugin example is gone"
    site.install("acme_calls", "acme_calls = acme_calls:annotate", "acme_calls", block.group(1))
    found = annotators.installed()
    assert [a.name for a in found] == ["builtin", "collective_calls", "acme_calls"]
    assert all(a.annotate for a in found)
    path_ = [_frame(SITE + "acme/metrics.py", 88, "MetricBank.sync"),
             _frame("/job/train.py", 31, "main")]
    d = annotators.apply(_diag(_missing(path_)), found, {"acme": "1.3.0"})
    (record,) = calls(d)
    assert (record["id"], record["call"], record["version"]) == (
        "acme-sync-metrics", "MetricBank.sync", "1.3.0")
    assert d.findings[0].hint == "Call MetricBank.sync() on every rank, at the same step. old hint"
    assert d.notes == ()
    assert calls(annotators.apply(_diag(_missing(path_)), found, {"acme": "1.1"})) == []


# -- every entry against the libraries' source ---------------------------------------------

def _defs(source: str) -> list[str]:
    """Every function's and class's qualname in a module's source, as co_qualname gives it."""
    out: list[str] = []

    def walk(node: ast.AST, prefix: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                out.append(prefix + child.name)
                walk(child, f"{prefix}{child.name}.<locals>.")
            elif isinstance(child, ast.ClassDef):
                out.append(prefix + child.name)
                walk(child, f"{prefix}{child.name}.")
            else:
                walk(child, prefix)

    walk(ast.parse(source), "")
    return out


def _files(site_dir: Path, fragment: str) -> list[Path]:
    target = site_dir / fragment
    if target.is_dir():
        return sorted(target.glob("*.py"))
    return [target] if target.is_file() else []


def _sources_of(entry: cc.Entry, site_dir: Path) -> dict[str, list[str]]:
    """fragment-relative file -> the qualnames there that end in one of the entry's names."""
    names = {fn.rpartition(".")[2] for fn in entry.functions}
    out = {}
    for fragment in entry.paths:
        for path in _files(site_dir, fragment):
            rel = path.relative_to(site_dir).as_posix()
            out[rel] = sorted(q for q in _defs(path.read_text(encoding="utf-8"))
                              if q.rpartition(".")[2] in names)
    return out


def _site_with(package: str) -> Path | None:
    """A site-packages that holds ``package``: this interpreter's, the frameworks tier's cached
    environment (tests/upstream/envs.py), or the one the catalog was first read in."""
    cache = Path(os.environ.get("NCCL_DOCTOR_UPSTREAM_CACHE")
                 or Path.home() / ".cache" / "nccl-doctor" / "upstream")
    candidates = [Path(p) for p in sys.path if p.endswith("-packages")]
    candidates += [Path(p) for p in sorted(glob.glob(str(cache / "frameworks-*" / "lib" / "python*"
                                                         / "site-packages")))]
    candidates.append(Path("/tmp/fw/lib/python3.11/site-packages"))
    return next((c for c in candidates if (c / package / "__init__.py").is_file()), None)


def _installed_version(site_dir: Path, package: str) -> str | None:
    found = sorted(site_dir.glob(f"{package}-*.dist-info"))
    return found[0].name[len(package) + 1:-len(".dist-info")] if found else None


def _check_defined(entry: cc.Entry, sources: dict[str, list[str]]) -> None:
    """Each of the entry's functions is defined in one of its files; each file defines one of
    them; a bare name could only be the entry's (no other def there has that last name)."""
    assert sources, f"{entry.id}: none of {entry.paths} found"
    for fn in entry.functions:
        if fn.startswith("*."):
            assert any(q.endswith(fn[1:]) for qs in sources.values() for q in qs), (entry.id, fn)
        else:
            assert any(fn in qs for qs in sources.values()), (entry.id, fn, sources)
    for fragment in entry.paths:
        held = [qs for rel, qs in sources.items() if rel.startswith(fragment)]
        assert held and any(held), (entry.id, fragment)
    if not any(fn.startswith("*.") for fn in entry.functions):
        for rel, qs in sources.items():
            assert set(qs) <= set(entry.functions), (entry.id, rel, qs)


IMPORTED = ("transformers", "accelerate", "torch")  # in the environment running the tests


@pytest.mark.parametrize("entry", [e for e in cc.builtin_catalog().entries
                                   if e.packages[0] in IMPORTED], ids=lambda e: e.id)
def test_each_function_exists_at_its_qualname_in_the_imported_library(entry):
    """The real module's function, unwrapped from its decorators, has the entry's qualname
    (co_qualname) and lives in the entry's file."""
    site_dir = _site_with(entry.packages[0])
    assert site_dir is not None
    _check_defined(entry, _sources_of(entry, site_dir))
    for fn in entry.functions:
        found = []
        for fragment in entry.paths:
            module = importlib.import_module(fragment.removesuffix(".py").replace("/", "."))
            obj = module
            for part in fn.split("."):
                obj = getattr(obj, part, None)
            while hasattr(obj, "__wrapped__"):
                obj = obj.__wrapped__
            code = getattr(obj, "__code__", None)
            if code is not None and code.co_filename.replace(os.sep, "/").endswith(fragment):
                found.append(code.co_qualname if sys.version_info >= (3, 11) else fn)
        assert found == [fn], (entry.id, fn, found)


def test_lightning_and_deepspeed_entries_against_their_source():
    """Read with ast (importing Lightning or DeepSpeed costs seconds and a GPU-less setup): from
    their installed source where there is one - which must then agree with the copy in
    tests/fixtures, taken from lightning 2.6.6 and deepspeed 0.19.8 - else from that copy."""
    fixture = json.loads(FIXTURE.read_text())
    entries = [e for e in cc.builtin_catalog().entries if e.packages[0] not in IMPORTED]
    assert {e.packages[0] for e in entries} == {"lightning", "deepspeed"}
    for entry in entries:
        for package in entry.packages:
            copied = fixture["packages"][package]
            own = [p for p in entry.paths if p.startswith(package + "/")]
            sub = cc.Entry(**{**entry.__dict__, "paths": tuple(own)})
            copy = {rel: qs for rel, qs in copied["files"].items()
                    if any(rel.startswith(p) for p in own)}
            names = {fn.rpartition(".")[2] for fn in entry.functions}
            copy = {rel: [q for q in qs if q.rpartition(".")[2] in names]
                    for rel, qs in copy.items()}
            _check_defined(sub, copy)
            site_dir = _site_with(package)
            if site_dir is None:
                continue
            real = _sources_of(sub, site_dir)
            _check_defined(sub, real)
            if _installed_version(site_dir, package) == copied["version"]:
                assert real == copy, (entry.id, package)


def test_analyze_applies_the_catalog_by_default(tb):
    """Through the analysis: the waiting ranks' recorded call path passes through
    Trainer.evaluate, with transformers' version as the ranks recorded it."""
    from nccl_doctor.analysis import analyze
    from nccl_doctor.location import Location
    from nccl_doctor.model import EventState

    path = (Location(SITE + "accelerate/utils/operations.py", 437, "gather"),
            Location(SITE + "transformers/trainer.py", 2871, "Trainer.evaluate"),
            Location("/job/train.py", 40, "main"))
    base = tb.scenarios["hang_missing"]()
    traces = replace(base, ranks={r: replace(
        t, meta=replace(t.meta, versions={"transformers": "5.24.0", "accelerate": "1.15.0"}),
        events=tuple(replace(e, callsite=path[-1], api_callsite=path[0], path=path)
                     if e.state is EventState.ENTERED and e.op == "all_reduce" else e
                     for e in t.events)) for r, t in base.ranks.items()})
    f = next(f for f in analyze(traces).findings if f.kind is FindingKind.MISSING_COLLECTIVE)
    assert [(r["call"], r["ranks"], r["version"]) for r in calls(_diag(f))] == [
        ("gather", [0, 2], "1.15.0"), ("Trainer.evaluate", [0, 2], "5.24.0")]
    assert "ranks 0, 2's call path passes through it at transformers/trainer.py:2871" in f.detail
    assert f.hint.startswith("Call trainer.evaluate() on every rank")
    plain = next(f for f in analyze(traces, annotators=()).findings
                 if f.kind is FindingKind.MISSING_COLLECTIVE)
    assert "collective_calls" not in plain.evidence
