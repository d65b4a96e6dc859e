"""Rank 0 waits on the work of an async all_reduce that rank 1 never joins: its main thread sits
in ``work.wait()``, inside the recorder's wrapper of it."""

import threading

import torch
import torch.distributed as dist

dist.init_process_group("gloo")
rank = dist.get_rank()
t = torch.ones(8)
dist.all_reduce(t)


def step() -> None:
    work = dist.all_reduce(t, async_op=True)
    work.wait()  # line 17: rank 0 waits here


if rank == 0:
    step()
else:
    threading.Event().wait()  # rank 1 never joins
