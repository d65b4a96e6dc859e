"""A data-driven skip on a 2 x 2 mesh (plain torch, gloo, 4 ranks): tensor-parallel groups
[0, 1] and [2, 3], data-parallel groups [0, 2] and [1, 3]. Each step the TP group sums its loss,
and a NaN guard (``if not torch.isfinite(loss): continue``) skips the step's DP all_reduce. At
step NAN_STEP (default 2; -1: never) rank 0's batch holds a NaN: its TP group, ranks 0 and 1,
skips that step's DP all_reduce, and from then on each DP all_reduce pairs a step of ranks 0, 1
with the step before of ranks 2, 3, until ranks 2, 3 wait in their last one alone.
"""
import os
from datetime import timedelta

import torch
import torch.distributed as dist

STEPS = 5


def load_batch(rank, step, nan_step):
    """The rank's batch: a NaN on rank 0 at ``nan_step`` stands for a bad sample."""
    batch = torch.ones(4)
    if rank == 0 and step == nan_step:
        batch[1] = float("nan")
    return batch


def main() -> None:
    dist.init_process_group("gloo", timeout=timedelta(seconds=60))
    rank = dist.get_rank()
    nan_step = int(os.environ.get("NAN_STEP", "2"))
    tp_groups = [dist.new_group([0, 1]), dist.new_group([2, 3])]
    dp_groups = [dist.new_group([0, 2]), dist.new_group([1, 3])]
    tp, dp = tp_groups[rank // 2], dp_groups[rank % 2]
    grad = torch.ones(8)
    for step in range(STEPS):
        loss = load_batch(rank, step, nan_step).sum().reshape(1)
        dist.all_reduce(loss, group=tp)
        if not torch.isfinite(loss).all():
            continue
        dist.all_reduce(grad, group=dp)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
