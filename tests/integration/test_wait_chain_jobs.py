"""Hangs through several groups (issue 50, part 5) on real gloo jobs, live and replayed
(tests/integration/jobs/wait_chain.py): a rank stuck in its own code on a 2 x 2 or 2 x 2 x 2
mesh; its peers wait for it, and their peers in other groups for them. The root cause is the
group where the ranks parted (the stuck rank missing from its call), never a group whose
absent ranks only wait elsewhere; every finding on the way says the chain of waits, each
group by its ranks (and by its role on a DeviceMesh), to the rank at its end; no finding
words a rank that has not come yet as a loop that ran a different number of times."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from nccl_doctor.supervisor.policy import HangPolicy
from tests.integration.test_branch_jobs import replayed, root_of
from tests.integration.test_mesh_jobs import coords

pytestmark = pytest.mark.integration

SCRIPT = Path(__file__).parent / "jobs" / "wait_chain.py"


def run(tmp_path, launch, watched, nproc: int, env: dict[str, str]) -> tuple[dict, dict]:
    sup, messages = watched(launch(nproc, str(SCRIPT)), tmp_path / "out", env,
                            HangPolicy(stuck_after=4, sample_every=1))
    result = sup.run()
    assert result.stopped_for_hang, messages
    return json.loads((sup.out_dir / "report.json").read_text()), replayed(sup.out_dir)


def check_chains(report: dict, stuck: int, dims: list[int]) -> list[dict]:
    """Every chain ends at the stuck rank, each link waits in a group holding the rank it waits
    for, and each link's rank is where the previous one waits for."""
    assert report["verdict"] == "hang"
    root = root_of(report)
    assert root["kind"] == "missing_collective", root
    assert root["evidence"]["missing_ranks"] == [stuck], root  # where they parted
    chains = [f["evidence"]["wait_chain"] for f in report["findings"]
              if f["evidence"].get("wait_chain")]
    assert root["evidence"].get("wait_chain"), root["detail"]
    for chain in chains:
        links, end = chain[:-1], chain[-1]
        assert end["rank"] == stuck and "outside any collective" in end["ends"], chain
        assert len({link["group"] for link in links}) >= 2, chain
        for link, after in zip(links, links[1:] + [end]):
            assert link["waits_for"] == [after["rank"]], chain
            assert {link["rank"], after["rank"]} <= set(link["group_ranks"]), chain
            # the two ranks differ in exactly one mesh coordinate: the group's dim
            a, b = coords(link["rank"], dims), coords(after["rank"], dims)
            assert sum(x != y for x, y in zip(a, b)) == 1, (a, b)
    for f in report["findings"]:
        assert "different number of times" not in f["detail"], f["detail"]
    return chains


@pytest.mark.parametrize("stuck", [3, 0])
def test_a_stuck_rank_on_a_2x2_mesh_is_the_end_of_the_chain(tmp_path, launch, watched, stuck):
    for report in run(tmp_path, launch, watched, 4, {"STUCK_RANK": str(stuck)}):
        chains = check_chains(report, stuck, [2, 2])
        # the rank diagonal to the stuck one waits for it through a second group
        assert any(len(chain) == 3 and chain[0]["rank"] == 3 - stuck for chain in chains)
        root = root_of(report)
        assert f"Wait chain: rank {3 - stuck} waits in all_reduce #3 of group" in root["detail"]


def test_a_device_mesh_chain_names_each_group_by_its_role(tmp_path, launch, watched):
    for report in run(tmp_path, launch, watched, 4, {"STUCK_RANK": "3", "MESH": "1"}):
        check_chains(report, 3, [2, 2])
        root = root_of(report)
        assert ("Wait chain: rank 0 waits in all_reduce #3 of the data-parallel (dp) group "
                "[0, 2] for rank 2; rank 2 waits in all_reduce #3 of the tensor-parallel (tp) "
                "group [2, 3] for rank 3; rank 3 is outside any collective") in root["detail"]


def test_a_chain_through_three_groups_on_a_2x2x2_mesh(tmp_path, launch, watched):
    for report in run(tmp_path, launch, watched, 8, {"DIMS": "2,2,2", "STUCK_RANK": "5"}):
        chains = check_chains(report, 5, [2, 2, 2])
        # rank 2 (coordinates 0,1,0, every one differing from 5's 1,0,1) waits through three
        assert any(len({link["group"] for link in chain[:-1]}) == 3 and chain[0]["rank"] == 2
                   for chain in chains), chains
