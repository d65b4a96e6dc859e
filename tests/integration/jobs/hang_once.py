"""Rank 1 skips a broadcast in the first attempt of an elastic launch (a deadlock: rank 0 waits
in it for good); the attempts its launcher restarts run to their end."""
import os

import torch
import torch.distributed as dist


def main() -> None:
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    t = torch.ones(4)
    first = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") == "0"
    for step in range(3):
        dist.all_reduce(t)
        if step == 1 and not (first and rank == 1):
            dist.broadcast(t, src=0)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
