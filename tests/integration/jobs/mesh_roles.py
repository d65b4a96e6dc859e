"""A healthy 2 x 2 DeviceMesh ("dp", "tp") job on gloo: each step all-reduces over the
tensor-parallel group (a layer's partial sums), then over the data-parallel group (the
gradients), then over the world (the loss). Every rank's coordinates are noted; tensor and data
parallel ranks do the same work, so every rank is a peer of every other. SKIP_DP_RANK: that
rank skips the data-parallel all_reduce of step 2 (a hang in the dp group)."""
from __future__ import annotations

import os
from datetime import timedelta

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh


def main() -> None:
    dist.init_process_group("gloo", timeout=timedelta(seconds=60))
    mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp", "tp"))
    tp, dp = mesh.get_group("tp"), mesh.get_group("dp")
    skipper = int(os.environ.get("SKIP_DP_RANK", "-1"))
    for step in range(int(os.environ.get("STEPS", "6"))):
        partial = torch.ones(8)
        dist.all_reduce(partial, group=tp)
        if not (step == 2 and dist.get_rank() == skipper):
            dist.all_reduce(partial, group=dp)
        dist.all_reduce(torch.ones(1))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
