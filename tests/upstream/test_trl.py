"""TRL, the real thing: the releases that had docs/bugs.md's A and B (each in a cached virtual
environment of its own, tests/upstream/envs.py), and the current release's DPO and GRPO, each
run as a user runs it: `nccl-doctor run -- torchrun --nproc-per-node 2 train.py` (gloo, CPU,
a tiny random Llama, an offline tokenizer). The diagnosis must name the TRL line that issued
the gather, the user's line, the upstream issue and its fix - live and in replay."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from envs import TRL_0_15_0, TRL_0_16_1, python_for

JOBS = Path(__file__).parent / "trl_jobs"
CLI = [sys.executable, "-m", "nccl_doctor"]

pytestmark = [pytest.mark.upstream, pytest.mark.timeout(1500)]  # (an environment may be built)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run(python: Path | str, job: str, out: Path) -> tuple[int, dict, dict]:
    """(exit status, report.json, the replay's report) of ``job`` under the doctor."""
    proc = subprocess.run(
        [*CLI, "run", "--out", str(out), "--", str(python), "-m", "torch.distributed.run",
         "--nproc-per-node", "2", "--master-port", str(free_port()), str(JOBS / job)],
        capture_output=True, text=True, timeout=600, cwd=JOBS)
    report = json.loads((out / "report.json").read_text())
    replay = subprocess.run([*CLI, "replay", "--format", "json", str(out)], capture_output=True,
                            text=True, timeout=120)
    assert replay.returncode == 0, replay.stderr[-2000:]
    return proc.returncode, report, json.loads(replay.stdout)


def root(report: dict) -> dict:
    return next(f for f in report["findings"] if f["root_cause"])


def assert_names_the_library_line(report: dict, file: str, function: str, version: str,
                                  job: str, rule: str, issue: str, fix: str) -> None:
    f = root(report)
    assert f["kind"] == "collective_mismatch" and f["evidence"]["aspect"] == "shape", f
    assert f["op"] == "all_gather" and f["ranks"] == [1], f  # no majority: the lowest rank's rule
    assert f["callsite"].endswith(file), f["callsite"]  # the TRL line that issued the gather
    train = next(i for i, line in enumerate((JOBS / job).read_text().splitlines(), 1)
                 if "trainer.train()" in line)
    assert f["entry_callsite"].endswith(f"{job}:{train}"), f  # the user's trainer.train()
    trl = [fr for fr in f["call_path"] if fr["package"] == "trl"]
    assert trl and trl[0]["function"].endswith(function) and trl[0]["version"] == version, trl
    assert f["call_path"][0]["package"] == "accelerate"  # the thin helper below it, kept
    for side in f["evidence"]["sides"]:
        assert f"{file} in " in side["callsite"] and f"(trl {version}) <- your " in \
            side["callsite"] and job in side["callsite"], side["callsite"]
    known = f["evidence"]["known_issue"]
    assert known["rule"] == rule and issue in known["upstream"], known
    assert known["library"] == f"trl {version}" and fix in f["hint"], (known, f["hint"])


@pytest.fixture(scope="module")
def trl_0_16_1() -> Path:
    return python_for("trl-0.16.1", TRL_0_16_1)


@pytest.fixture(scope="module")
def trl_0_15_0() -> Path:
    return python_for("trl-0.15.0", TRL_0_15_0)


def test_cpo_on_trl_0_16_1_is_known_issue_a_at_trls_line(trl_0_16_1, tmp_path):
    status, report, replay = run(trl_0_16_1, "trl_cpo.py", tmp_path / "out")
    assert status != 0 and report["verdict"] == "crash"  # gloo aborts a rank (NCCL would hang)
    for r in (report, replay):
        assert_names_the_library_line(r, "trl/trainer/cpo_trainer.py:839",
                                      "get_batch_loss_metrics", "0.16.1", "trl_cpo.py",
                                      "A", "#3068", "v0.17.0")
    shapes = {s["value"] for s in root(report)["evidence"]["sides"]}
    assert len(shapes) == 2 and all(v.startswith("float32[1,") and v.endswith(",64]")
                                    for v in shapes), shapes  # [B, T_rank, V]


def test_sft_on_trl_0_15_0_is_known_issue_b_at_trls_line(trl_0_15_0, tmp_path):
    status, report, replay = run(trl_0_15_0, "trl_sft.py", tmp_path / "out")
    assert status != 0 and report["verdict"] == "crash"
    for r in (report, replay):
        assert_names_the_library_line(r, "trl/trainer/sft_trainer.py:448", "compute_loss",
                                      "0.15.0", "trl_sft.py", "B", "#2879", "v0.15.1")


@pytest.mark.parametrize("job", ["trl_dpo.py", "trl_grpo.py"])
def test_healthy_runs_on_the_current_trl_read_ok(job, tmp_path):
    status, report, replay = run(sys.executable, job, tmp_path / "out")
    assert status == 0
    for r in (report, replay):
        assert r["verdict"] == "ok" and r["findings"] == [], [f["title"] for f in r["findings"]]
        assert [x["state"] for x in r["ranks"]] == ["exited", "exited"]
