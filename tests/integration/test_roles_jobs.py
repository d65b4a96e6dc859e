"""Roles on real gloo jobs (docs/stragglers.md): each rank's DeviceMesh coordinates and pipeline
stage are noted (plugins/roles.py) and said in report.json; the straggler rule compares ranks of
the same role only; a slower stage is an info finding with its cost, never a straggler. The
pipelines are torch's own (torch.distributed.pipelining: PipelineStage, ScheduleGPipe) on a 2 x 2
mesh, 2 stages x 2 replicas (tests/integration/jobs/pipeline_roles.py)."""

from __future__ import annotations

import json
import os
from pathlib import Path

from nccl_doctor.analysis import analyze
from nccl_doctor.analysis.calls.loaded import load_capture_dir
from nccl_doctor.supervisor.supervisor import Supervisor
from nccl_doctor.testing.spawn import command

JOBS = Path(__file__).parent / "jobs"


def run(tmp_path: Path, job: str, **env: str) -> dict:
    """The job under the doctor; its report.json, checked against a replay of its captures."""
    out = tmp_path / "capture"
    result = Supervisor(command(4, [str(JOBS / job)]), out,
                        environ=dict(os.environ, **env)).run()
    assert result.analysis_error is None, result.analysis_error
    assert result.exit_status == 0
    report = json.loads((out / "report.json").read_text())
    replayed = analyze(load_capture_dir(out), annotators=()).to_json()
    assert replayed["verdict"] == report["verdict"]
    assert [(f["kind"], f["ranks"]) for f in replayed["findings"]] == [
        (f["kind"], f["ranks"]) for f in report["findings"]]
    assert [r.get("role") for r in replayed["ranks"]] == [r.get("role") for r in report["ranks"]]
    return report


def kinds(report: dict, kind: str) -> list[dict]:
    return [f for f in report["findings"] if f["kind"] == kind]


def test_a_healthy_pipeline_whose_last_stage_is_slower_reads_ok_with_its_cost(tmp_path):
    report = run(tmp_path, "pipeline_roles.py", SCENARIO="imbalanced", SLOW_MS="40")
    assert report["verdict"] == "ok", report["findings"]
    assert kinds(report, "straggler") == []
    (f,) = kinds(report, "pipeline_imbalance")
    assert f["severity"] == "info" and f["ranks"] == [1, 3]
    ev = f["evidence"]
    assert ev["stage"] == [1] and ev["replicas"] == 2 and ev["steps"] >= 5
    # the last stage sleeps 4 x 40 ms in its forward and 40 ms scoring: ~200 ms a step more
    assert 0.15 <= ev["excess_per_step_s"] <= 0.30, ev
    assert 0.3 < ev["idle_share"] <= 1.0, ev
    assert "pipeline stage 1 takes" in f["title"] and "more per step than stage 0" in f["title"]
    # each rank's coordinates, as noted in the rank: the mesh and the stage
    roles = {r["rank"]: r["role"] for r in report["ranks"]}
    for rank, coords in {0: [0, 0], 1: [0, 1], 2: [1, 0], 3: [1, 1]}.items():
        (mesh,) = roles[rank]["meshes"]
        assert mesh["dims"] == ["dp", "pp"] and mesh["shape"] == [2, 2]
        assert mesh["coords"] == coords
        assert roles[rank]["stages"] == [coords[1]] and roles[rank]["num_stages"] == 2
        assert roles[rank]["inferred"] is False
    # the two replicas' pipeline groups, and each stage's data-parallel group
    assert roles[0]["pipeline_group"] == roles[1]["pipeline_group"] != roles[2]["pipeline_group"]
    assert set(roles[0]["groups"]) & set(roles[2]["groups"]) - set(roles[1]["groups"])


def test_a_slow_replica_stage_is_a_straggler_against_its_same_stage_peer(tmp_path):
    report = run(tmp_path, "pipeline_roles.py", SCENARIO="slow_replica", SLOW_RANK="2",
                 SLOW_RANK_MS="150")
    assert report["verdict"] == "suspect"
    (f,) = kinds(report, "straggler")
    assert f["ranks"] == [2], f["title"]
    assert "compared with the ranks of its role only: rank 0." in f["detail"]
    # rank 3, the next stage of rank 2's replica, waits for it: said, not named
    assert "Rank 3 arrives late too" in f["detail"]
    row = {r["rank"]: r for r in f["evidence"]["lateness"]}[2]
    assert 0.10 <= row["per_step_s"] <= 0.20, row


def test_a_2x2_mesh_records_each_ranks_coordinates(tmp_path):
    report = run(tmp_path, "mesh_roles.py")
    assert report["verdict"] == "ok" and report["findings"] == []
    coords = {r["rank"]: r["role"]["meshes"][0]["coords"] for r in report["ranks"]}
    assert coords == {0: [0, 0], 1: [0, 1], 2: [1, 0], 3: [1, 1]}
    for r in report["ranks"]:
        mesh = r["role"]["meshes"][0]
        assert mesh["dims"] == ["dp", "tp"] and r["role"]["stages"] == []
        # each dim's group is one of the groups the rank is in
        assert set(mesh["groups"]) <= set(r["role"]["groups"])


def test_a_hang_in_one_mesh_dim_names_its_group_by_the_dim(run_job):
    """Rank 3 skips the data-parallel all_reduce of step 2 on a 2 x 2 ("dp", "tp") mesh: the
    root cause names the group by its role on the mesh, live and replayed."""
    job = run_job(4, str(JOBS / "mesh_roles.py"), env={"SKIP_DP_RANK": "3"})
    live = json.loads((job.out / "report.json").read_text())
    again = analyze(load_capture_dir(job.out), annotators=()).to_json()
    for report in (live, again):
        assert report["verdict"] == "hang"
        (root,) = [f for f in report["findings"] if f["root_cause"]]
        assert root["kind"] == "missing_collective" and root["ranks"] == [3], root["title"]
        assert "the data-parallel (dp) group [1, 3]" in root["title"], root["title"]
        assert root["evidence"]["group_role"] == "the data-parallel (dp) group [1, 3]"
