"""One rank leaves its training loop early and exits 0 while the others go on."""

import os

import torch
import torch.distributed as dist

LEAVER = int(os.environ.get("LEAVER", "2"))


def main() -> None:
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    for step in range(6):
        grad = torch.ones(16) * rank
        dist.all_reduce(grad)  # the gradient all-reduce every rank needs
        if rank == LEAVER and step == 2:
            break  # e.g. this rank ran out of data: uneven shards
    if rank == LEAVER:
        dist.destroy_process_group()
        return
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
