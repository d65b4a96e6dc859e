"""Process groups made differently on different ranks (issue 50), and their healthy twins.

SCENARIO:
  members_only  - new_group([0, 1]) called by its members only: every later group is named
                  differently on ranks 0, 1 and on ranks 2, 3
  order         - ranks 0, 1 make [0, 1] then [2, 3]; ranks 2, 3 make them the other way round
  subgroups     - new_subgroups(2) on every rank but the last, which goes on to an all_reduce
  mesh_subset   - a 2-D DeviceMesh made by every rank but rank 1
  healthy       - every rank makes every group, in the same order; members use theirs
  local         - members-only groups with use_local_synchronization=True (allowed)
"""
import os
from datetime import timedelta

import torch
import torch.distributed as dist


def main() -> None:
    backend = os.environ.get("BACKEND", "gloo")
    timeout = timedelta(seconds=float(os.environ.get("GLOO_TIMEOUT_S", "1800")))
    if backend == "nccl":
        # several NCCL ranks on one GPU: each claims its own host id, so NCCL's duplicate-GPU
        # check does not apply and the ranks talk over loopback sockets
        os.environ["NCCL_HOSTID"] = f"fakehost{os.environ['RANK']}"
        torch.cuda.set_device(0)
        dist.init_process_group("nccl", timeout=timeout)
    else:
        dist.init_process_group("gloo", timeout=timeout)
    rank, world = dist.get_rank(), dist.get_world_size()
    scenario = os.environ.get("SCENARIO", "healthy")
    x = torch.ones(4, device="cuda" if backend == "nccl" else "cpu")
    dist.all_reduce(x)
    if scenario == "members_only":
        if rank in (0, 1):
            dist.new_group([0, 1])
        pair = dist.new_group([0, 2])
        if rank in (0, 2):
            dist.all_reduce(x, group=pair)
    elif scenario == "order":
        if rank < 2:
            low = dist.new_group([0, 1])
            high = dist.new_group([2, 3])
        else:
            high = dist.new_group([2, 3])
            low = dist.new_group([0, 1])
        dist.all_reduce(x, group=low if rank < 2 else high)
    elif scenario == "subgroups":
        if rank != world - 1:
            dist.new_subgroups(group_size=2)
        dist.all_reduce(x)
    elif scenario == "mesh_subset":
        from torch.distributed.device_mesh import init_device_mesh

        if rank != 1:
            init_device_mesh(x.device.type, (2, world // 2), mesh_dim_names=("dp", "tp"))
        dist.all_reduce(x)
    elif scenario == "healthy":
        low = dist.new_group([0, 1])
        pair = dist.new_group([0, 2])
        if rank in (0, 1):
            dist.all_reduce(x, group=low)
        if rank in (0, 2):
            dist.all_reduce(x, group=pair)
        dist.all_reduce(x)
    elif scenario == "local":
        if rank in (0, 1):
            low = dist.new_group([0, 1], use_local_synchronization=True)
            dist.all_reduce(x, group=low)
        pair = dist.new_group([0, 2])
        if rank in (0, 2):
            dist.all_reduce(x, group=pair)
        dist.all_reduce(x)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
