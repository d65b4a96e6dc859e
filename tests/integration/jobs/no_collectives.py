"""A few collectives, then a long stretch with none on any rank: MODE=idle blocks every rank on
a queue that is never fed (a dataloader deadlock), MODE=busy computes for SECONDS on every rank
(a long generation phase) and then finishes."""

import os
import queue
import time

import torch
import torch.distributed as dist


def wait_for_batch() -> None:
    queue.Queue().get()  # nothing ever puts: idle, forever


def generate(seconds: float) -> float:
    end, x = time.monotonic() + seconds, 0.0
    while time.monotonic() < end:
        x += sum(i * 0.5 for i in range(1000))
    return x


def main() -> None:
    dist.init_process_group("gloo")
    for _ in range(3):
        dist.all_reduce(torch.ones(4))
    if os.environ.get("MODE", "idle") == "idle":
        wait_for_batch()
    else:
        generate(float(os.environ.get("SECONDS", "10")))
    dist.all_reduce(torch.ones(4))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
