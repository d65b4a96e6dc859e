"""Rank 1 raises in the first attempt of an elastic launch; the second attempt runs to its end."""
import os

import torch
import torch.distributed as dist


def main() -> None:
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    t = torch.ones(4)
    for step in range(3):
        dist.all_reduce(t)
        if step == 1 and rank == 1 and os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") == "0":
            raise ValueError("bad batch in the first attempt")
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
