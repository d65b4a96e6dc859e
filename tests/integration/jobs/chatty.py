"""A healthy job whose rank 0 prints numbered lines while it trains: LINES lines (default 40),
PAUSE seconds apart (default 0.05), an all_reduce after each. Its output must reach the terminal
unchanged under the live status. (Only rank 0 prints: two processes printing to one terminal
interleave their own lines, which would hide what the test looks for.)"""

import os
import time

import torch
import torch.distributed as dist


def main() -> None:
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    lines = int(os.environ.get("LINES", "40"))
    pause = float(os.environ.get("PAUSE", "0.05"))
    for i in range(lines):
        time.sleep(pause)
        if rank == 0:
            print(f"job line {i:03d} " + "x" * (i % 50), flush=True)
        t = torch.ones(2)
        dist.all_reduce(t)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
