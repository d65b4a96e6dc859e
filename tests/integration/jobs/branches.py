"""The branch on the rank that splits the ranks, in the ways users write it (plain torch, gloo).
SCENARIO picks one; each ends with every rank in a different collective, or one waiting alone.

- rank0_barrier: ``if rank == 0: dist.barrier()`` before an all_reduce every rank makes
- skip_continue: a rank-dependent ``continue`` that skips an all_reduce in a loop
- via_variable: ``is_master = rank == 0`` ... ``if is_master:`` around a broadcast
- in_helper: the branch inside a helper module of the user's (branch_helpers.py)
- in_caller: the branch around the call of a user's function that makes the collective
- in_library: the branch inside an installed library's helper (site-packages/acme_metrics)
- healthy: every rank makes the same calls
"""
import os
import sys
from datetime import timedelta

import torch
import torch.distributed as dist

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "site-packages"))


def evaluate(t):
    dist.all_reduce(t)
    return t


def main() -> None:
    dist.init_process_group("gloo", timeout=timedelta(seconds=60))
    rank = dist.get_rank()
    scenario = os.environ["SCENARIO"]
    t = torch.ones(8)
    dist.all_reduce(t)  # every rank, in step
    if scenario == "rank0_barrier":
        if rank == 0:
            dist.barrier()
        dist.all_reduce(t)
    elif scenario == "skip_continue":
        for step in range(4):
            if rank == 1 and step == 2:
                continue
            dist.all_reduce(t)
        dist.barrier()
    elif scenario == "via_variable":
        is_master = rank == 0
        if is_master:
            dist.broadcast(t, src=0)
        dist.all_reduce(torch.ones(3))
    elif scenario == "in_helper":
        import branch_helpers

        branch_helpers.sync_loss(t, rank)
        dist.all_reduce(torch.ones(3))
    elif scenario == "in_caller":
        if rank == 0:
            evaluate(torch.ones(5))
        dist.barrier()
    elif scenario == "in_library":
        import acme_metrics

        acme_metrics.log_metric(torch.ones(2))
        dist.barrier()
    else:
        dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
