"""Rank 1 dies of SIGSEGV (a NULL read through ctypes); rank 0 waits until the launcher stops it."""

import ctypes
import threading

import torch
import torch.distributed as dist


def crash() -> None:
    ctypes.string_at(0)  # line 11: rank 1 faults here


dist.init_process_group("gloo")
dist.all_reduce(torch.ones(4))
if dist.get_rank() == 1:
    crash()
threading.Event().wait()
