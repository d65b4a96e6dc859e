"""The reference preference trainers run clean under the doctor on 2 gloo ranks, and gathering
per-rank-padded logits (docs/bugs.md A) is diagnosed with both shapes at the trainer's line."""

from __future__ import annotations

import pytest

from nccl_doctor.diagnosis import FindingKind, Verdict

pytestmark = pytest.mark.integration


@pytest.mark.parametrize("method", ["dpo", "cpo", "simpo", "orpo"])
def test_preference_trainer_runs_clean(run_job, method):
    job = run_job(2, "-m", "nccl_doctor.trainers.preference", "--method", method, "--steps", "2")
    assert job.exit_status == 0
    assert job.diagnosis.verdict is Verdict.OK, [f.title for f in job.diagnosis.findings]


def test_gathering_padded_logits_is_a_shape_mismatch(run_job):
    job = run_job(2, "-m", "nccl_doctor.trainers.preference", "--method", "cpo",
                  "--gather-logits", "whole")
    root = job.diagnosis.root_cause
    assert root is not None and root.kind is FindingKind.COLLECTIVE_MISMATCH
    assert root.op == "all_gather" and root.evidence["aspect"] == "shape"
    shapes = {s["value"] for s in root.evidence["sides"]}
    assert len(shapes) == 2 and all(s.startswith("float32[2,") for s in shapes)
    assert root.callsite.startswith("nccl_doctor/trainers/preference.py:")
