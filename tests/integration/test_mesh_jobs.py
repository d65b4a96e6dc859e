"""2-D and 3-D DeviceMeshes on real gloo jobs, live (the report.json the supervisor writes) and
replayed: FSDP2 + tensor parallel on a 2 x 2 ("dp", "tp") mesh, 4 ranks
(tests/integration/jobs/fsdp2_tp.py: torch's own ``parallelize_module`` and ``fully_shard``), and
a 2 x 2 x 2 ("pp", "dp", "tp") mesh, 8 ranks, whose pipeline stages send their activations over
the pipeline group (tests/integration/jobs/mesh_3d.py). Each job has a healthy twin (the same
code, nothing parts the ranks) that reads ok and names nothing; a rank that skips a step on a
branch on the rank is named with its group's role on the mesh and the branch; a NaN guard is
named as a jump the data decided, with the ranks that took it. The culprit rank (or the
replica holding the NaN) is parametrized, so that nothing is tuned to one rank."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from test_branch_jobs import line_of, replayed, root_of  # (this directory: on sys.path)

pytestmark = pytest.mark.integration

JOBS = Path(__file__).parent / "jobs"
FSDP = JOBS / "fsdp2_tp.py"
MESH3 = JOBS / "mesh_3d.py"

DATA = "because of the data, not the rank number"


def reports(job) -> tuple[dict, dict]:
    """The job's report as the supervisor wrote it, and as ``replay`` reads it again."""
    return json.loads((job.out / "report.json").read_text()), replayed(job.out)


def coords(rank: int, shape: list[int]) -> list[int]:
    """A rank's coordinates on a row-major mesh of ``shape`` (init_device_mesh's layout)."""
    out = []
    for size in reversed(shape):
        out.append(rank % size)
        rank //= size
    return out[::-1]


def dp_group(rank: int, shape: list[int]) -> list[int]:
    """The ranks of ``rank``'s data-parallel group: the mesh's dim "dp" is the one before the
    innermost "tp" (of size shape[-1])."""
    tp = shape[-1]
    base = rank - (coords(rank, shape)[-2] * tp)
    return [base + i * tp for i in range(shape[-2])]


def dp_role(rank: int, shape: list[int]) -> str:
    return f"the data-parallel (dp) group [{', '.join(map(str, dp_group(rank, shape)))}]"


def problems(report: dict) -> list[dict]:
    return [f for f in report["findings"] if f["severity"] in ("warning", "error")]


# -- healthy twins ------------------------------------------------------------------------------

# twin -> (ranks, job, environment, the mesh's dims, its shape)
TWINS = {
    "fsdp2_tp-skip": (4, FSDP, {"SCENARIO": "skip", "SKIP_RANK": "-1"}, ["dp", "tp"], [2, 2]),
    "fsdp2_tp-nan_guard": (4, FSDP, {"SCENARIO": "nan_guard", "NAN_STEP": "-1"}, ["dp", "tp"],
                           [2, 2]),
    "mesh_3d-skip": (8, MESH3, {"SCENARIO": "skip", "SKIP_RANK": "-1"}, ["pp", "dp", "tp"],
                     [2, 2, 2]),
    "mesh_3d-nan_guard": (8, MESH3, {"SCENARIO": "nan_guard", "NAN_STEP": "-1"},
                          ["pp", "dp", "tp"], [2, 2, 2]),
}


@pytest.mark.parametrize("twin", sorted(TWINS))
def test_a_healthy_twin_reads_ok_and_names_nothing(run_job, twin):
    """The job's code with nothing that parts the ranks (no rank skips, no NaN): ok, no warning
    and no error, live and replayed; each rank's coordinates on the mesh said."""
    nproc, script, env, dims, shape = TWINS[twin]
    job = run_job(nproc, str(script), env=env)
    assert job.exit_status == 0
    for report in reports(job):
        assert report["verdict"] == "ok", report["findings"]
        assert problems(report) == [], problems(report)
        roles = {r["rank"]: r["role"] for r in report["ranks"]}
        assert sorted(roles) == list(range(nproc))
        for rank, role in roles.items():
            (mesh,) = role["meshes"]
            assert mesh["dims"] == dims and mesh["shape"] == shape, mesh
            assert mesh["coords"] == coords(rank, shape), (rank, mesh)


# -- a skip in one group: a branch on the rank --------------------------------------------------

def mismatches(report: dict) -> dict[str, dict]:
    """The report's collective mismatches, by their group's role on the mesh."""
    found = [f for f in report["findings"] if f["kind"] == "collective_mismatch"]
    by_role = {f["evidence"].get("group_role"): f for f in found}
    assert len(by_role) == len(found), [f["title"] for f in found]
    return by_role


@pytest.mark.parametrize("skipper", [3, 0])
def test_fsdp2_tp_a_rank_that_skips_a_backward_parts_its_data_parallel_group(run_job, skipper):
    """One rank of FSDP2 + TP leaves a step after its forward (``if rank == skip_rank and step
    == skip_step: continue``): it makes no backward (no all-gather, no reduce-scatter) that
    step, and its data-parallel peer's reduce-scatter meets its next step's all-gather there:
    a mismatch in the skipper's data-parallel group, said by its role on the mesh."""
    job = run_job(4, str(FSDP), env={"SCENARIO": "skip", "SKIP_RANK": str(skipper)})
    assert job.exit_status != 0
    role = dp_role(skipper, [2, 2])
    for report in reports(job):
        assert report["verdict"] == "hang", report["findings"]
        found = mismatches(report)
        assert list(found) == [role], list(found)  # only the skipper's group parted
        sides = {side["op"]: side["ranks"] for side in found[role]["evidence"]["sides"]}
        # the skipper is a step ahead: its next backward's all-gather meets the peer's
        # reduce-scatter
        assert sides == {"all_gather_single": [skipper],
                         "reduce_scatter_single": [r for r in dp_group(skipper, [2, 2])
                                                   if r != skipper]}, sides
        assert f"[group {found[role]['group']}: {role}]" in found[role]["title"]
        # the same line on both sides, a pass apart: the side ahead left its pass early, and
        # the `continue` on the rank before the other side's call is why (analysis/who/ahead.py)
        root = root_of(report)
        assert root == found[role], root["title"]
        assert root["ranks"] == [skipper], (root["ranks"], root["detail"])
        text = "if rank == skip_rank and step == skip_step:"
        line = line_of(FSDP, text, 'scenario == "skip"')
        branch = root["branch"]
        assert (branch["path"], branch["line"], branch["text"]) == (str(FSDP), line, text)
        assert branch["kind"] == "jump" and branch["ranks"] == [skipper], branch
        assert branch["culprit"] is True and root["evidence"]["blame"] == "branch", root
        assert root["evidence"]["ahead"]["ranks"] == [skipper], root["evidence"]
        assert f"rank {skipper} is a pass ahead of rank" in root["detail"], root["detail"]
        assert "a different number of times" not in root["detail"], root["detail"]
        for f in report["findings"]:  # no rank but the skipper is said to have taken it
            if (f.get("branch") or {}).get("culprit"):
                assert f["branch"]["ranks"] == [skipper], (f["title"], f["detail"])


@pytest.mark.parametrize("skipper", [6, 1])
def test_mesh_3d_a_rank_that_skips_its_data_parallel_all_reduce_is_named(run_job, skipper):
    """On a 2 x 2 x 2 ("pp", "dp", "tp") mesh one rank does not all-reduce its gradients at one
    step (``if rank != skip_rank or step != skip_step:``): its data-parallel group's finding
    names it, the group by its role on the mesh, and the branch, blaming the rank that took it."""
    job = run_job(8, str(MESH3), env={"SCENARIO": "skip", "SKIP_RANK": str(skipper)})
    assert job.exit_status != 0
    text = "if rank != skip_rank or step != skip_step:"
    line = line_of(MESH3, text, 'scenario == "skip"')
    role = dp_role(skipper, [2, 2, 2])
    for report in reports(job):
        assert report["verdict"] == "hang", report["findings"]
        assert root_of(report)["kind"] == "missing_collective", root_of(report)
        (dp,) = [f for f in report["findings"] if f["kind"] == "missing_collective"
                 and f["evidence"].get("group_role") == role]
        assert dp["ranks"] == [skipper], (dp["title"], dp["detail"])
        assert dp["op"] == "all_reduce" and f"[group {dp['group']}: {role}]" in dp["title"]
        branch = dp["branch"]
        assert branch is not None, dp["detail"]
        assert (branch["path"], branch["line"], branch["text"]) == (str(MESH3), line, text)
        assert branch["kind"] == "if" and branch["ranks"] == [skipper], branch
        assert branch["culprit"] is True and dp["evidence"]["blame"] == "branch", dp
        assert f"mesh_3d.py:{line}" in dp["detail"] and text in dp["detail"], dp["detail"]
        assert "data_jump" not in dp["evidence"]
        # nothing blames the data for a branch on the rank
        for f in report["findings"]:
            assert DATA not in f["detail"], f["detail"]
        # it is the root cause: the world barrier the others wait in is a consequence (the
        # ranks wait for each other in a cycle; the skipper's peer has not reached the barrier)
        assert root_of(report) == dp, root_of(report)["title"]
        # the skip paired the following all_reduces across steps: said, with the same branch
        (skew,) = [f for f in report["findings"] if f["kind"] == "step_skew"]
        assert skew["ranks"] == [skipper] and skew["evidence"]["branch"]["line"] == line, skew
        assert "data_jump" not in skew["evidence"], skew["evidence"]
        for f in report["findings"]:  # no rank but the skipper is said to have taken it
            if (f.get("branch") or {}).get("culprit"):
                assert f["branch"]["ranks"] == [skipper], (f["title"], f["detail"])


# -- a NaN guard: a jump the data decided -------------------------------------------------------

@pytest.mark.parametrize("replica", [0, 1])
def test_mesh_3d_a_nan_guard_is_named_as_data_with_the_ranks_that_took_it(run_job, replica):
    """Stage 1 of one data-parallel replica reads labels holding a NaN: the two ranks of its
    tensor-parallel group leave the step (``if not torch.isfinite(loss): continue``) before the
    data-parallel all_reduce. The guard is named as a jump the data decided, with those ranks."""
    job = run_job(8, str(MESH3), env={"SCENARIO": "nan_guard", "NAN_REPLICA": str(replica)})
    assert job.exit_status != 0
    took = [4 + 2 * replica, 5 + 2 * replica]  # stage 1, this replica: a tensor-parallel group
    guard = line_of(MESH3, "if not torch.isfinite(loss):", 'scenario == "nan_guard"')
    call = line_of(MESH3, "dist.all_reduce(grad, group=dp)", 'scenario == "nan_guard"')
    for report in reports(job):
        assert report["verdict"] == "hang", report["findings"]
        root = root_of(report)
        assert root["kind"] == "missing_collective", root
        # the data-parallel all_reduces paired across steps after the skip: the step skew says
        # the jump and the ranks that took it
        (skew,) = [f for f in report["findings"] if f["kind"] == "step_skew"]
        assert skew["ranks"] == took, (skew["title"], skew["detail"])
        jump = skew["evidence"]["data_jump"]
        assert (jump["line"], jump["leaves"], jump["path"]) == (guard, "continue", str(MESH3))
        assert f"mesh_3d.py:{call}" in skew["title"], skew["title"]
        assert DATA in skew["detail"], skew["detail"]
        assert skew["evidence"]["group_role"] in {dp_role(r, [2, 2, 2]) for r in took}
        # no branch on the rank is blamed for what the data did
        for f in report["findings"]:
            assert (f.get("branch") or {}).get("culprit") is not True, f
        # the root cause and each data-parallel group's missing all_reduce name the jump and
        # the ranks that took it (the calls before the guard are made in a helper,
        # stage_forward, that the loop calls before it: they show the loop ran as often)
        jump = root["evidence"].get("data_jump")
        assert jump is not None, (root["title"], root["detail"])
        assert (jump["line"], jump["leaves"], jump["call_line"]) == (guard, "continue", call)
        assert set(jump["ranks"]) <= set(took) and jump["ranks"], jump
        assert DATA in root["detail"], root["detail"]
        dp = [f for f in report["findings"] if f["kind"] == "missing_collective"
              and f["op"] == "all_reduce"]
        assert len(dp) == 2, [f["title"] for f in dp]
        for f in dp:
            (mine,) = [r for r in took if dp_role(r, [2, 2, 2]) == f["evidence"]["group_role"]]
            assert f["evidence"]["data_jump"]["ranks"] == [mine], f["detail"]


@pytest.mark.parametrize("replica", [0, 1])
def test_fsdp2_tp_a_nan_guard_parts_the_data_parallel_groups(run_job, replica):
    """One data-parallel replica's batch holds a NaN: its two tensor-parallel ranks (whose loss
    the TP all_reduce made the same) leave the step before the backward (``if not
    torch.isfinite(loss): continue``); in each data-parallel group the other replica's
    reduce-scatter then meets their next step's all-gather."""
    job = run_job(4, str(FSDP), env={"SCENARIO": "nan_guard", "NAN_REPLICA": str(replica)})
    assert job.exit_status != 0
    took = [2 * replica, 2 * replica + 1]
    for report in reports(job):
        assert report["verdict"] == "hang", report["findings"]
        found = mismatches(report)
        assert sorted(found) == sorted(dp_role(r, [2, 2]) for r in took), list(found)
        for rank in took:
            sides = {side["op"]: side["ranks"]
                     for side in found[dp_role(rank, [2, 2])]["evidence"]["sides"]}
            assert sides["all_gather_single"] == [rank], sides  # a step ahead
        # no branch on the rank is blamed for what the data did
        for f in report["findings"]:
            assert (f.get("branch") or {}).get("culprit") is not True, f
        # each mismatch names the guard and the rank of its group that took it (a pass ahead)
        guard = line_of(FSDP, "if not torch.isfinite(loss):", 'scenario == "nan_guard"')
        for role, f in found.items():
            jump = f["evidence"].get("data_jump")
            assert jump is not None, (f["title"], f["detail"])
            (mine,) = [r for r in took if dp_role(r, [2, 2]) == role]
            assert (jump["line"], jump["leaves"], jump["ranks"]) == (guard, "continue", [mine])
            assert f["ranks"] == [mine], f
            assert DATA in f["detail"] and "a different number of times" not in f["detail"]
