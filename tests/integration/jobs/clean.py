"""A healthy job touching many recorded call types: nothing may be reported."""

import torch
import torch.distributed as dist


def main() -> None:
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    pairs = dist.new_group([0, 1])
    for step in range(3):
        t = torch.full((4, 3), float(rank))
        dist.all_reduce(t)
        out = [torch.empty(4, 3) for _ in range(world)]
        dist.all_gather(out, t)
        dist.broadcast(t, src=step % world)
        objs = [None] * world
        dist.all_gather_object(objs, {"rank": rank, "step": step})
        if rank in (0, 1):  # p2p between two ranks only: bumps their sequence numbers alone
            buf = torch.zeros(2)
            if rank == 0:
                dist.send(buf + 1, dst=1)
            else:
                dist.recv(buf, src=0)
            dist.all_reduce(buf, group=pairs)
        work = dist.all_reduce(torch.ones(2), async_op=True)
        work.wait()
        dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
