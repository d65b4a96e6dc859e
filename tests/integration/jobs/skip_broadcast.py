"""A rank-dependent branch: one rank skips a broadcast (the others wait in it forever)."""
import os
import time

import torch
import torch.distributed as dist


def main() -> None:
    dist.init_process_group(os.environ.get("BACKEND", "gloo") or None, timeout=_timeout())
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


def _timeout():
    """BACKEND "" initialises with no backend ("undefined"); GLOO_TIMEOUT_S sets the backend's
    own timeout (default: 30 minutes, never reached by the tests that do not set it)."""
    from datetime import timedelta  # (here: the lines the tests name stay where they were)

    return timedelta(seconds=float(os.environ.get("GLOO_TIMEOUT_S", "1800")))


if __name__ == "__main__":
    try:
        main()
    except RuntimeError:
        if os.environ.get("ON_TIMEOUT") != "retry":
            raise
        dist.all_reduce(torch.ones(1))  # a new call after the backend gave up (as on NCCL)
        raise
