"""At step 2 rank 1 broadcasts where every other rank all-reduces."""

import datetime

import torch
import torch.distributed as dist


def main() -> None:
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=8))
    rank = dist.get_rank()
    for step in range(4):
        t = torch.ones(8)
        if rank == 1 and step == 2:
            dist.broadcast(t, src=0)  # the odd one out
        else:
            dist.all_reduce(t)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
