"""At step 2 rank CULPRIT (default 1) all-reduces a tensor of another size than its peers."""

import os

import torch
import torch.distributed as dist


def main() -> None:
    dist.init_process_group("gloo")
    rank, culprit = dist.get_rank(), int(os.environ.get("CULPRIT", "1"))
    for step in range(4):
        size = 12 if rank == culprit and step == 2 else 8
        dist.all_reduce(torch.ones(size))  # the culprit's size differs at step 2
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
