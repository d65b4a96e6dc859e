"""Two gloo ranks that start the nccl-doctor agent, then rank 0 blocks in a collective.

Launched as plain ``python agent_blocked.py`` with MASTER_ADDR/MASTER_PORT/RANK/WORLD_SIZE,
NCCL_DOCTOR_RUN_ID (the agent's run id) and MODE:

- ``plain``: three all_reduces, one send/recv, one more all_reduce;
- ``ddp``: one all_reduce, a ``Linear(4, 2)`` wrapped in DistributedDataParallel, one backward
  (DDP's collectives are issued from C++, not through the torch.distributed Python API).

Each rank then prints ``SEQ {label: group sequence number after that step}`` and rank 1 sleeps
instead of joining the broadcast that rank 0 enters in ``wait_in_broadcast``: rank 0 stays blocked
there (gloo's timeout is 30 minutes) until the test kills both.
"""

from __future__ import annotations

import json
import os
import sys
import time

import torch
import torch.distributed as dist

from nccl_doctor.rank import agent as server
def seq() -> int:
    return dist.group.WORLD._get_sequence_number_for_group()


def plain_steps(rank: int, marks: dict[str, int]) -> None:
    for _ in range(3):
        dist.all_reduce(torch.ones(4))
    marks["all_reduce x3"] = seq()
    if rank == 0:
        dist.send(torch.ones(2), dst=1)
    else:
        dist.recv(torch.zeros(2), src=0)
    marks["send/recv"] = seq()
    dist.all_reduce(torch.ones(5))
    marks["all_reduce"] = seq()


def ddp_steps(rank: int, marks: dict[str, int]) -> None:
    dist.all_reduce(torch.ones(4))
    marks["all_reduce"] = seq()
    torch.manual_seed(0)
    model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(4, 2))
    marks["ddp init"] = seq()
    model(torch.ones(3, 4) * (rank + 1)).sum().backward()
    marks["backward"] = seq()


def wait_in_broadcast() -> None:
    t = torch.zeros(7)
    dist.broadcast(t, src=0)  # rank 1 never joins


def main() -> None:
    if server.start(os.environ["NCCL_DOCTOR_RUN_ID"]) is None:
        sys.exit(3)
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    marks: dict[str, int] = {"init": seq()}
    if os.environ.get("MODE", "plain") == "ddp":
        ddp_steps(rank, marks)
    else:
        plain_steps(rank, marks)
    print("SEQ " + json.dumps(marks), flush=True)
    if rank == 0:
        wait_in_broadcast()
    else:
        time.sleep(60)


if __name__ == "__main__":
    main()
