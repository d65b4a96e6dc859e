"""Ranks that can never meet in init_process_group's rendezvous (issue 50).

SCENARIO:
  wrong_port - the last rank is told another MASTER_PORT (an environment override on one rank):
               it waits there alone, the others wait for it
  absent     - the last rank never calls init_process_group (it waits on an event that never
               comes, as a rank stuck loading data before joining would)
  healthy    - every rank joins
"""
import os
import threading
from datetime import timedelta

import torch
import torch.distributed as dist


def main() -> None:
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    scenario = os.environ.get("SCENARIO", "healthy")
    if scenario == "wrong_port" and rank == world - 1:
        os.environ["MASTER_PORT"] = str(int(os.environ["MASTER_PORT"]) + 1)
    if scenario == "absent" and rank == world - 1:
        threading.Event().wait()  # never joins
    dist.init_process_group("gloo", timeout=timedelta(seconds=float(
        os.environ.get("GLOO_TIMEOUT_S", "600"))))
    x = torch.ones(4)
    dist.all_reduce(x)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
