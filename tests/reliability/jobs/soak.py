"""A long healthy job, compressed: CALLS tiny collectives per rank (default 200,000) - a mix of
all_reduce, broadcast and all_gather, with a barrier every 1,000 - and nothing else."""

import os

import torch
import torch.distributed as dist


def main() -> None:
    dist.init_process_group("gloo")
    world = dist.get_world_size()
    calls = int(os.environ.get("CALLS", "200000"))
    t = torch.ones(4)
    out = [torch.empty(4) for _ in range(world)]
    for i in range(calls):
        kind = i % 4
        if kind == 0 or kind == 1:
            dist.all_reduce(t)
            t.fill_(1.0)
        elif kind == 2:
            dist.broadcast(t, src=0)
        elif i % 1000 == 3:
            dist.barrier()
        else:
            dist.all_gather(out, t)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
