"""Two nodes; node 1's ranks (2, 3) go on in a group of their own while node 0's ranks wait
outside any collective. Once FLAG_DIR/go exists, rank 3 calls a broadcast where rank 2 calls
an all_reduce in that group: a deadlock on node 1 alone (the test first loses node 0's
doctor)."""
import os
import time
from pathlib import Path

import torch
import torch.distributed as dist


def main() -> None:
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    pair = dist.new_group([2, 3])  # (every rank makes it)
    t = torch.ones(4)
    for _ in range(5):
        dist.all_reduce(t)
    go = Path(os.environ["FLAG_DIR"]) / "go"
    if rank < 2:  # node 0: no more collectives with node 1
        while True:
            time.sleep(0.1)
    while not go.exists():
        dist.all_reduce(t, group=pair)
        time.sleep(0.05)
    if rank == 3:
        dist.broadcast(t, src=2, group=pair)
    else:
        dist.all_reduce(t, group=pair)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
