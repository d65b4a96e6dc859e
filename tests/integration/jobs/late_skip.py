"""Healthy steps first - STEPS steps of PAUSE seconds each (default 60 x 0.15 s), time for the
nodes' doctors to meet - then rank SKIPPER (default 3) skips a broadcast and goes on to the
next all_reduce while the others wait in the broadcast: a hang the leader calls, and stops, as
a decision every node reads from the coordinator's store."""
import os
import time

import torch
import torch.distributed as dist


def main() -> None:
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    for _ in range(int(os.environ.get("STEPS", "60"))):
        time.sleep(float(os.environ.get("PAUSE", "0.15")))
        dist.all_reduce(torch.ones(4))
    if rank != int(os.environ.get("SKIPPER", "3")):
        dist.broadcast(torch.ones(4), src=0)
    dist.all_reduce(torch.ones(4))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
