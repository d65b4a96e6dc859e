"""A plain training-like loop: compute (sleep), then an all_reduce, per step. Healthy.

STEPS steps (default 40); PAUSE seconds of "compute" per step (default 0.2); SLOW_RANK sleeps
SLOW_SECONDS more before every collective (a straggler); BUSY_RANK burns CPU for BUSY_SECONDS
once, at BUSY_STEP, while the others wait in a barrier (an evaluation on rank 0)."""

import os
import sys
import time

import torch
import torch.distributed as dist


def compute(seconds: float) -> None:
    time.sleep(seconds)


def load_batch(seconds: float) -> None:
    time.sleep(seconds)  # the straggler's extra work (a slow input pipeline)


def evaluate(seconds: float) -> float:
    end, x = time.monotonic() + seconds, 0.0
    while time.monotonic() < end:  # CPU-bound, and the stack moves
        x += sum(i * 0.5 for i in range(1000))
    return x


def main() -> None:
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    steps = int(os.environ.get("STEPS", "40"))
    pause = float(os.environ.get("PAUSE", "0.2"))
    slow = int(os.environ.get("SLOW_RANK", "-1"))
    slow_s = float(os.environ.get("SLOW_SECONDS", "0"))
    busy = int(os.environ.get("BUSY_RANK", "-1"))
    busy_s = float(os.environ.get("BUSY_SECONDS", "0"))
    busy_step = int(os.environ.get("BUSY_STEP", "1"))
    # one write (print writes the text and its newline apart: two ranks' lines could interleave)
    sys.stdout.write(f"rank {rank} pid {os.getpid()} ready\n")
    sys.stdout.flush()
    for step in range(steps):
        compute(pause)
        if rank == slow:
            load_batch(slow_s)
        t = torch.ones(4) * rank
        dist.all_reduce(t)
        if step == busy_step:
            if rank == busy:
                evaluate(busy_s)
            dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
