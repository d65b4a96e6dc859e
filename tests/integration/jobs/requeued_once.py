"""Rank 1 raises in the first launch of a Slurm batch job; the launch its requeue starts
(SLURM_RESTART_COUNT 1) runs to its end."""
import os

import torch
import torch.distributed as dist


def main() -> None:
    dist.init_process_group("gloo")
    t = torch.ones(4)
    for _ in range(3):
        dist.all_reduce(t)
    if dist.get_rank() == 1 and os.environ.get("SLURM_RESTART_COUNT", "0") == "0":
        raise RuntimeError("node lost its data mount")
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
