"""Where a reference trainer or reproducer runs (nccl_doctor/trainers/placement.py), from
torchrun's variables and the GPUs torch sees: one GPU per rank when there are enough, else ranks
share them, each with its own NCCL host id."""

from __future__ import annotations

import pytest

from nccl_doctor.trainers.placement import PlacementError, place, visible_gpus


def torchrun(rank: int, world: int, local_world: int | None = None, addr: str = "node-a",
             **more: str) -> dict[str, str]:
    local_world = local_world or world
    return {"RANK": str(rank), "WORLD_SIZE": str(world), "LOCAL_RANK": str(rank % local_world),
            "LOCAL_WORLD_SIZE": str(local_world), "MASTER_ADDR": addr, **more}


def test_cpu_is_gloo_and_nccl_needs_a_gpu():
    p = place("cpu", None, torchrun(1, 2), gpus=8)
    assert (p.device, p.backend, p.env, p.shared) == ("cpu", "gloo", {}, False)
    with pytest.raises(PlacementError, match="--backend nccl needs GPUs"):
        place("cpu", "nccl", torchrun(0, 2), gpus=8)
    with pytest.raises(PlacementError, match="torch sees no GPU"):
        place("cuda", None, torchrun(0, 2), gpus=0)


def test_one_gpu_per_rank_when_there_are_enough():
    got = [place("cuda", None, torchrun(r, 4), gpus=8) for r in range(4)]
    assert [p.device for p in got] == ["cuda:0", "cuda:1", "cuda:2", "cuda:3"]
    assert all(p.backend == "nccl" and p.env == {} and not p.shared for p in got)
    assert "one GPU per rank (4 ranks)" in got[0].describe()


def test_real_nodes_count_their_own_ranks():
    # 2 hosts x 4 ranks, 4 GPUs each: LOCAL_RANK picks the GPU
    got = [place("cuda", None, torchrun(r, 8, local_world=4), gpus=4) for r in range(8)]
    assert [p.device for p in got] == [f"cuda:{i}" for i in (0, 1, 2, 3, 0, 1, 2, 3)]
    assert not any(p.env for p in got)


def test_simulated_nodes_on_one_machine_do_not_collide():
    # 2 torchrun agents on localhost (reproducers/nodes.py): LOCAL_RANK restarts on each, so it
    # would put ranks 0 and 2 on one GPU; the whole job is here, so RANK picks
    got = [place("cuda", None, torchrun(r, 4, local_world=2, addr="127.0.0.1"), gpus=4)
           for r in range(4)]
    assert [p.device for p in got] == ["cuda:0", "cuda:1", "cuda:2", "cuda:3"]


def test_fewer_gpus_than_ranks_share_through_nccls_socket_path():
    got = [place("cuda", None, torchrun(r, 8), gpus=1) for r in range(8)]
    assert {p.device for p in got} == {"cuda:0"} and all(p.shared for p in got)
    assert len({p.env["NCCL_HOSTID"] for p in got}) == 8  # no two ranks claim one host
    assert {p.env["NCCL_SOCKET_IFNAME"] for p in got} == {"lo"}  # the whole job is here
    assert "8 ranks share 1 GPU" in got[0].describe()
    two = [place("cuda", None, torchrun(r, 4), gpus=2) for r in range(4)]
    assert [p.device for p in two] == ["cuda:0", "cuda:1", "cuda:0", "cuda:1"]
    # a host of a real multi-node job: host ids per rank, but its sockets are the user's choice
    (p,) = [place("cuda", None, torchrun(5, 16, local_world=8), gpus=4)]
    assert p.device == "cuda:1" and "NCCL_SOCKET_IFNAME" not in p.env
    # what the user set stays
    p = place("cuda", None, torchrun(1, 2, NCCL_HOSTID="mine", NCCL_SOCKET_IFNAME="eth0"), gpus=1)
    assert p.env == {} and p.shared
    # gloo on CUDA tensors needs no host id
    assert place("cuda", "gloo", torchrun(1, 2), gpus=1).env == {}


def test_visible_gpus_says_why_there_are_none(monkeypatch):
    gpus, why = visible_gpus()
    assert (gpus > 0) == (why == "")
    monkeypatch.setattr("os.path.exists", lambda path: False)
    monkeypatch.setattr("glob.glob", lambda pattern: [])
    assert visible_gpus() == (0, "no NVIDIA driver on this host")
