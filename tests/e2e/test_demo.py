"""`nccl-doctor demo`: each reproducer of docs/bugs.md under the doctor, and its --fixed variant:
on the CPU with gloo, and in the gpu tier on CUDA with NCCL, where the diagnosis must be the same."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from nccl_doctor.analysis.calls.loaded import load_capture_dir
from nccl_doctor.errors import ExitStatus

from .test_cli import one_error_line
from .conftest import doctor

pytestmark = pytest.mark.integration


@pytest.fixture(params=["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
def device(request) -> str:
    return request.param


def demo(tmp_path, device: str, *args: str):
    out = tmp_path / "o"
    proc = doctor("demo", *args, "--device", device, "--out", str(out), timeout=300)
    said = proc.stderr.splitlines()[0] if proc.stderr else ""
    assert ("with NCCL" in said if device == "cuda" else "on the CPU with gloo" in said), said
    report = json.loads((out / "report.json").read_text())
    return proc, report, out


def line_of(module: str, text: str) -> str:
    """'path:N' of the line holding ``text`` in a module's source, the path as reports show it
    (relative to the working directory when below it: reproducers/ in an editable install)."""
    import importlib

    from nccl_doctor.paths import short_path

    source = Path(importlib.import_module(module).__file__)
    n = next(i for i, ln in enumerate(source.read_text().splitlines(), 1) if text in ln)
    return f"{short_path(str(source))}:{n}"


def root(report: dict) -> dict:
    return next(f for f in report["findings"] if f["root_cause"])


def test_list_and_unknown_names():
    listed = doctor("demo", "--list")
    assert listed.returncode == 0
    names = [ln.split()[0] for ln in listed.stdout.splitlines()]
    assert names == ["cpo_logits_gather", "sft_packing_false", "grpo_node_seed",
                     "weight_sync_join", "zero3_generate"]
    assert "(default)" in listed.stdout.splitlines()[0]
    bad = doctor("demo", "nope")
    assert bad.returncode == ExitStatus.USAGE and "demo --list" in one_error_line(bad)
    variant = doctor("demo", "zero3_generate", "--variant", "packing")
    assert variant.returncode == ExitStatus.USAGE
    assert "no variant 'packing'" in one_error_line(variant)


def test_cpo_logits_gather_hangs_where_the_padded_logits_are_gathered(tmp_path, device):
    proc, report, out = demo(tmp_path, device)  # the default reproducer
    assert proc.returncode == ExitStatus.HANG_STOPPED, proc.stderr[-3000:]
    f = root(report)
    assert report["verdict"] == "hang" and f["kind"] == "collective_mismatch"
    # two ranks, no majority: rank 1 named against rank 0, as torchfrtrace would, and said so
    assert f["evidence"]["aspect"] == "op" and f["ranks"] == [1] and "No majority" in f["detail"]
    sides = {s["value"]: (s["ranks"], s["callsite"]) for s in f["evidence"]["sides"]}
    # the rank with the shorter T finished its chunks and reduces the loss; its peer still
    # gathers logits chunks
    short, long_ = sides["all_reduce"][0][0], sides["all_gather"][0][0]
    assert sides["all_gather"][1] == line_of("nccl_doctor.trainers.preference",
                                             "dist.all_gather(out, t.contiguous())")
    assert sides["all_reduce"][1] == line_of("nccl_doctor.trainers.preference",
                                             "dist.all_reduce(reduced)")
    traces = load_capture_dir(out)
    blocked = {r: t.events[-1] for r, t in traces.ranks.items()}
    assert blocked[short].op == "all_reduce" and blocked[short].seq == f["seq"]
    assert blocked[long_].op == "all_gather" and blocked[long_].seq == f["seq"]
    assert "ROOT CAUSE collective_mismatch" in proc.stderr
    assert f["evidence"]["known_issue"]["rule"] == "A"  # no TRL here: the general fix
    assert "known issue" in proc.stderr and "gather a reduced value" in f["hint"]
    # the demo's trainer is nccl-doctor's, not the user's
    assert "rank 1: nccl-doctor's " in f["detail"] and "your " not in f["detail"], f["detail"]


def test_cpo_logits_gather_fixed_is_ok(tmp_path, device):
    proc, report, _ = demo(tmp_path, device, "cpo_logits_gather", "--fixed")
    assert proc.returncode == 0 and report["verdict"] == "ok", proc.stderr[-3000:]
    # a healthy report is short: the calls issued from C++ are for the record (report.json)
    assert report["notes"] == [] and "note:" not in proc.stderr, proc.stderr[-3000:]
    assert any("not recorded: issued from C++" in d for d in report["details"]), report


def test_zero3_generate_hangs_in_the_weight_gather(tmp_path, device):
    proc, report, _ = demo(tmp_path, device, "zero3_generate")
    assert proc.returncode == ExitStatus.HANG_STOPPED, proc.stderr[-3000:]
    f = root(report)
    assert f["kind"] == "collective_mismatch" and f["evidence"]["aspect"] == "op"
    sides = {s["value"]: (s["ranks"], s["callsite"]) for s in f["evidence"]["sides"]}
    # step 2: rank 0 decodes 3 tokens, rank 1 four: rank 0 reduces the loss while rank 1 gathers
    zero3 = "nccl_doctor.reproducers.zero3_generate"
    assert sides["all_reduce"] == ([0], line_of(zero3, "dist.all_reduce(loss)"))
    assert sides["all_gather"] == ([1], line_of(zero3, "dist.all_gather(full, shard)"))
    # step 1 = 3 gathers + 1 reduce; step 2 = 3 gathers, then #8
    assert f["seq"] == 8
    assert f["evidence"]["known_issue"]["rule"] == "E" and "synced_gpus" in f["hint"]


def test_zero3_generate_fixed_is_ok(tmp_path, device):
    proc, report, _ = demo(tmp_path, device, "zero3_generate", "--fixed")
    assert proc.returncode == 0 and report["verdict"] == "ok", proc.stderr[-3000:]


def test_grpo_node_seed_is_said_per_node(tmp_path, device):
    proc, report, _ = demo(tmp_path, device, "grpo_node_seed", "--fail-on", "suspect")
    assert proc.returncode == ExitStatus.VERDICT_FAILED, proc.stderr[-3000:]
    found = {f["kind"]: f for f in report["findings"]}
    assert report["verdict"] == "suspect"
    same = found["identical_completions"]
    assert same["evidence"]["classes"] == [[0, 1], [2, 3]]
    assert same["title"].startswith("all local ranks of each node sampled identical completions")
    assert found["shared_rng_state"]["evidence"]["seeding"]["2"] == "torch.manual_seed(1235)"
    assert "reward_std" in found["degenerate_signal"]["evidence"]["criteria"]
    assert same["evidence"]["known_issue"]["rule"] == "C"


def test_grpo_node_seed_fixed_is_ok(tmp_path, device):
    proc, report, _ = demo(tmp_path, device, "grpo_node_seed", "--fixed", "--fail-on", "suspect")
    assert proc.returncode == 0 and report["verdict"] == "ok", proc.stderr[-3000:]


def test_sft_packing_false_hangs_against_ddps_allreduce(tmp_path, device):
    proc, report, _ = demo(tmp_path, device, "sft_packing_false")
    assert proc.returncode == ExitStatus.HANG_STOPPED, proc.stderr[-3000:]
    f = root(report)
    assert f["kind"] == "collective_mismatch" and f["evidence"]["aspect"] == "op"
    sides = {s["value"]: (s["ranks"], s["callsite"]) for s in f["evidence"]["sides"]}
    # the shorter rank finished its chunks and went into DDP's gradient all_reduce, issued
    # from C++: only Flight Recorder saw it
    assert sides["all_gather"][1] == line_of("nccl_doctor.reproducers.sft_packing_false",
                                             "dist.all_gather(parts, chunk.contiguous())")
    # placed by the Python stack Flight Recorder kept when it was made: the backward line
    assert sides["all_reduce"][1] == line_of("nccl_doctor.reproducers.sft_packing_false",
                                             "loss.backward()") + \
        " (issued from C++ during backward)", sides
    assert sorted(sides["all_gather"][0] + sides["all_reduce"][0]) == [0, 1]
    assert report["watchdog"]["situation"] == "deadlock"
    assert f["evidence"]["known_issue"]["rule"] == "B"


@pytest.mark.parametrize("args", [["--variant", "packing"], ["--fixed"]],
                         ids=["packing", "fixed"])
def test_sft_packing_false_controls_are_ok(tmp_path, device, args):
    proc, report, _ = demo(tmp_path, device, "sft_packing_false", *args)
    assert proc.returncode == 0 and report["verdict"] == "ok", proc.stderr[-3000:]


def test_weight_sync_join_blames_rank_0_in_the_rendezvous(tmp_path, device):
    proc, report, out = demo(tmp_path, device, "weight_sync_join")
    assert proc.returncode == ExitStatus.HANG_STOPPED, proc.stderr[-3000:]
    f = root(report)
    assert f["kind"] == "missing_collective" and f["ranks"] == [0] and f["op"] == "barrier"
    assert f["seq"] == 2  # after the training group's first all_reduce
    source = "nccl_doctor.reproducers.weight_sync_join"
    assert f["callsite"] == line_of(source, "dist.barrier()  # the other actors")
    # where rank 0 is instead, from its stack: waiting for the worker in the rendezvous
    assert line_of(source, "world_size=1 + engines, is_master=True") in f["detail"]
    assert "create_weight_sync_group" in f["detail"] and "idle" in f["evidence"]["stuck"]["0"]
    assert report["watchdog"]["how"] == "stuck_peer"
    assert f["evidence"]["known_issue"]["rule"] == "D"


def test_weight_sync_join_fixed_is_ok(tmp_path, device):
    proc, report, _ = demo(tmp_path, device, "weight_sync_join", "--fixed")
    assert proc.returncode == 0 and report["verdict"] == "ok", proc.stderr[-3000:]
    assert "engine worker: received weights" in proc.stdout
