"""Rank 0 issues an all_reduce with async_op=True and goes on without waiting for it (as every
NCCL collective does on the CPU); rank 1 never joins it: it blocks on an input that never comes.
The recorder saw rank 0's call return; only Flight Recorder knows its work never completed."""

import threading

import torch
import torch.distributed as dist

dist.init_process_group("gloo")
rank = dist.get_rank()
t = torch.ones(8)
dist.all_reduce(t)
never = threading.Event()


def wait_for_input() -> None:
    never.wait()  # line 18: rank 1 is stuck here


if rank == 0:
    work = dist.all_reduce(t, async_op=True)  # line 22: returns at once
    never.wait()  # rank 0 goes on (here: waits too, idle) without work.wait()
else:
    wait_for_input()
