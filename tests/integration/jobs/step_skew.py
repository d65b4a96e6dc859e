"""Calls paired across steps on a 2 x 2 mesh (plain torch, gloo, 4 ranks), a job that never
hangs: tensor-parallel groups [0, 1] and [2, 3], data-parallel groups [0, 2] and [1, 3]. The
loop runs until each rank has made STEPS successful steps; a NaN guard skips a pass's DP
all_reduce. SCENARIO:

- ``skip``: rank 0's batch holds a NaN on pass NAN_PASS (default 2, 0-based): ranks 0, 1 skip
  that pass's DP all_reduce and run one pass more; from then on each DP all_reduce pairs a pass
  of ranks 0, 1 with the pass before of ranks 2, 3. Every rank makes STEPS all_reduces: the
  job ends well, its gradients averaged across different steps.
- ``healthy``: no NaN.
- ``accumulate``: healthy, with gradient accumulation (a DP all_reduce every second pass) and a
  metrics all_reduce on the TP group every third pass: neither counts the steps, nothing is
  skewed.

PAUSE (seconds, default 0) sleeps each pass, so that the job is still running when the doctor
reads the skew.
"""
import os
import time
from datetime import timedelta

import torch
import torch.distributed as dist


def load_batch(rank, n, nan_pass):
    """The rank's batch on pass ``n``: a NaN on rank 0 at ``nan_pass`` stands for a bad
    sample."""
    batch = torch.ones(4)
    if rank == 0 and n == nan_pass:
        batch[1] = float("nan")
    return batch


def main() -> None:
    dist.init_process_group("gloo", timeout=timedelta(seconds=60))
    rank = dist.get_rank()
    scenario = os.environ.get("SCENARIO", "skip")
    steps = int(os.environ.get("STEPS", "6"))
    pause = float(os.environ.get("PAUSE", "0"))
    nan_pass = int(os.environ.get("NAN_PASS", "2")) if scenario == "skip" else -1
    every = 2 if scenario == "accumulate" else 1
    tp_groups = [dist.new_group([0, 1]), dist.new_group([2, 3])]
    dp_groups = [dist.new_group([0, 2]), dist.new_group([1, 3])]
    tp, dp = tp_groups[rank // 2], dp_groups[rank % 2]
    grad = torch.ones(8)
    done = n = 0
    while done < steps:
        loss = load_batch(rank, n, nan_pass).sum().reshape(1)
        dist.all_reduce(loss, group=tp)
        n += 1
        time.sleep(pause)
        if not torch.isfinite(loss).all():
            continue
        if scenario == "accumulate" and n % 3 == 0:
            metric = torch.ones(1)
            dist.all_reduce(metric, group=tp)
        if n % every == 0:
            dist.all_reduce(grad, group=dp)
        done += 1
    dist.barrier()
    print(f"rank {rank}: {n} passes, {done} steps", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
