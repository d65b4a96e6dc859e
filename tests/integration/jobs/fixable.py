"""Desyncs whose fix ``nccl-doctor check --fix`` makes (tests/integration/test_check_fix_jobs.py). As
written, rank 0 makes collectives the other ranks skip and the job hangs or fails; after
``check --fix`` every rank makes them, the job runs healthy and ``check`` is clean.

- the loss logged by the main process, all-reduced inside the ``if`` (first in its arm)
- rank 0 saves, then waits for the others in a barrier inside the ``if`` (last in its arm)
- the final weights broadcast under ``if dist.get_rank() == 0:`` alone
"""
import os
from datetime import timedelta

import torch
import torch.distributed as dist


def log_loss(loss, is_main):
    if is_main:
        dist.all_reduce(loss)  # the mean loss, for the log
        print(f"loss {loss.item() / dist.get_world_size():.3f}", flush=True)
    return loss


def main() -> None:
    dist.init_process_group("gloo", timeout=timedelta(seconds=60))
    rank = dist.get_rank()
    weights = torch.full((4,), float(rank))
    for step in range(3):
        loss = torch.tensor([float(rank + step)])
        log_loss(loss, is_main=(rank == 0))
        weights += loss
        # rank 0 saves; every rank waits until it has
        if rank == 0:
            torch.save(weights, os.devnull)
            dist.barrier()
    if dist.get_rank() == 0:  # the others take rank 0's weights
        dist.broadcast(weights, src=0)
    assert torch.equal(weights, torch.full((4,), weights[0].item())), weights
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
