"""A rank stuck in its own code on a mesh of several groups (plain torch, gloo): the ranks wait
for it through a chain of groups. DIMS (default "2,2": a 2 x 2 mesh, 4 ranks; "2,2,2": 8
ranks) sizes the mesh, its last dim the innermost (consecutive ranks). Each step makes one
all_reduce in each dim's group, the innermost first. At step STUCK_STEP (default 2) rank
STUCK_RANK (default the last) is held up reading its batch (a read that never returns): its
innermost group's peers wait for it there, the peers of their next group wait for those in
the next group, and so on - every rank but one waits in a collective, most for a rank that
is itself waiting. MESH=1 makes the groups with torch's ``init_device_mesh`` (dims named dp, tp;
or pp, dp, tp), so that the doctor can name each group by its role.
"""
import itertools
import os
import time
from datetime import timedelta

import torch
import torch.distributed as dist


def read_batch(rank, step, stuck_rank, stuck_step):
    """The rank's batch; on ``stuck_rank`` at ``stuck_step`` a read that never returns."""
    if rank == stuck_rank and step == stuck_step:
        while True:
            time.sleep(0.5)
    return torch.ones(4)


def mesh_groups(dims):
    """Per dim, this rank's group (every rank makes every group, in the same order)."""
    world, rank = dist.get_world_size(), dist.get_rank()
    coords = list(itertools.product(*[range(d) for d in dims]))
    mine = coords[rank]
    groups = []
    for axis in range(len(dims)):
        own = None
        for fixed in itertools.product(*[range(d) for i, d in enumerate(dims) if i != axis]):
            members = [r for r in range(world)
                       if [c for i, c in enumerate(coords[r]) if i != axis] == list(fixed)]
            g = dist.new_group(members)
            if rank in members:
                own = g
        groups.append(own)
    assert len(coords) == world and mine is not None
    return groups


def main() -> None:
    dims = [int(d) for d in os.environ.get("DIMS", "2,2").split(",")]
    dist.init_process_group("gloo", timeout=timedelta(seconds=120))
    rank, world = dist.get_rank(), dist.get_world_size()
    stuck_rank = int(os.environ.get("STUCK_RANK", str(world - 1)))
    stuck_step = int(os.environ.get("STUCK_STEP", "2"))
    if os.environ.get("MESH") == "1":
        from torch.distributed.device_mesh import init_device_mesh

        names = ("dp", "tp") if len(dims) == 2 else ("pp", "dp", "tp")
        mesh = init_device_mesh("cpu", tuple(dims), mesh_dim_names=names)
        groups = [mesh.get_group(name) for name in names]
    else:
        groups = mesh_groups(dims)
    for step in range(4):
        x = read_batch(rank, step, stuck_rank, stuck_step)
        for g in reversed(groups):  # the innermost dim's group first
            dist.all_reduce(x, group=g)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
