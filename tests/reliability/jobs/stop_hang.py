"""Two ranks deadlock in mismatched collectives (rank 0 all_reduce, rank 1 all_gather), each
after printing a line it never flushes: stdout to a pipe is block-buffered, so the line is still
in the rank's buffer when the doctor stops the job. HANDLER_RANK stops on SIGTERM its own way
(as Lightning's SLURM handler does)."""

import os
import signal
import sys

import torch
import torch.distributed as dist

dist.init_process_group("gloo")
rank = dist.get_rank()
if rank == int(os.environ.get("HANDLER_RANK", "-1")):
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
dist.all_reduce(torch.ones(4))
print(f"rank {rank}: last words before the hang")
if rank == 0:
    dist.all_reduce(torch.ones(4))
else:
    dist.all_gather([torch.empty(2), torch.empty(2)], torch.ones(2))
