"""The reference trainers run clean under the doctor on 2 gloo ranks (and, in the gpu tier, on 2
NCCL ranks), and gathering per-rank-padded logits (docs/bugs.md A) is diagnosed with both shapes
at the trainer's line. A device this machine lacks is one line and exit status 2."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from nccl_doctor.diagnosis import FindingKind, Verdict
from nccl_doctor.analysis.calls.loaded import load_capture_dir

pytestmark = pytest.mark.integration


DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("method", ["dpo", "cpo", "simpo", "orpo"])
def test_preference_trainer_runs_clean(run_job, method, device):
    job = run_job(2, "-m", "nccl_doctor.trainers.preference", "--method", method, "--steps", "2",
                  "--device", device)
    assert job.exit_status == 0
    assert job.diagnosis.verdict is Verdict.OK, [f.title for f in job.diagnosis.findings]
    backends = {g.backend for g in load_capture_dir(job.out).groups.values()}
    assert backends == {"nccl" if device == "cuda" else "gloo"}, backends


@pytest.mark.parametrize("device", DEVICES)
def test_grpo_trainer_runs_clean(run_job, device):
    job = run_job(2, "-m", "nccl_doctor.trainers.grpo", "--steps", "2", "--device", device)
    assert job.exit_status == 0
    assert job.diagnosis.verdict is Verdict.OK, [f.title for f in job.diagnosis.findings]


@pytest.mark.parametrize("args, says", [
    (["--backend", "nccl"], "--backend nccl needs GPUs: add --device cuda"),
    (["--device", "cuda"], "torch sees no GPU"),
], ids=["nccl-on-cpu", "cuda-without-gpu"])
def test_a_device_this_machine_lacks_is_one_line(args, says):
    env = dict(os.environ, CUDA_VISIBLE_DEVICES="")  # a GPU machine hides its GPUs
    for module in ("nccl_doctor.trainers.grpo", "nccl_doctor.reproducers.zero3_generate"):
        proc = subprocess.run([sys.executable, "-m", module, *args], capture_output=True,
                              text=True, timeout=120, env=env)
        lines = proc.stderr.strip().splitlines()
        assert proc.returncode == 2 and says in lines[-1], proc.stderr
        assert "Traceback" not in proc.stderr


def test_gathering_padded_logits_is_a_shape_mismatch(run_job):
    job = run_job(2, "-m", "nccl_doctor.trainers.preference", "--method", "cpo",
                  "--gather-logits", "whole")
    root = job.diagnosis.root_cause
    assert root is not None and root.kind is FindingKind.COLLECTIVE_MISMATCH
    assert root.op == "all_gather" and root.evidence["aspect"] == "shape"
    shapes = {s["value"] for s in root.evidence["sides"]}
    assert len(shapes) == 2 and all(s.startswith("float32[2,") for s in shapes)
    assert root.callsite.startswith("nccl_doctor/trainers/preference.py:")
