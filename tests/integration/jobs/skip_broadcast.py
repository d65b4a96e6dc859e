"""A rank-dependent branch: one rank skips a broadcast (the others wait in it forever)."""
import os
import time

import torch
import torch.distributed as dist


def main() -> None:
    dist.init_process_group(os.environ.get("BACKEND", "gloo") or None)  # "": none ("undefined")
    rank = dist.get_rank()
    skipper = int(os.environ.get("SKIPPER", "1"))
    for step in range(4):
        t = torch.ones(16) * rank
        dist.all_reduce(t)
        if step == 2 and rank == skipper:
            pass  # the bug: this rank thinks it has nothing to broadcast
        else:
            dist.broadcast(t, src=0)
        time.sleep(0.05)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
