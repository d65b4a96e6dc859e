"""Ranks that raise before they join a process group: each rank in RAISERS (comma-separated;
unset: every rank) reads a setting its config lacks (KeyError: 'lr', after RAISE_AFTER
seconds); the others go on to init_process_group and wait there for it, until the launcher
stops them or INIT_TIMEOUT seconds pass. Without a launcher (``python raise_before_init.py``)
the process is rank 0."""

import os
import time
from datetime import timedelta

import torch.distributed as dist

CONFIG = {"batch_size": 8}


def settings(rank: int) -> dict:
    raisers = os.environ.get("RAISERS")
    if raisers is None or str(rank) in raisers.split(","):
        time.sleep(float(os.environ.get("RAISE_AFTER", "0")))
        return {"lr": CONFIG["lr"]}  # the setting nobody wrote
    return {"lr": 0.1}


def main() -> None:
    settings(int(os.environ.get("RANK", "0")))
    timeout = timedelta(seconds=float(os.environ.get("INIT_TIMEOUT", "20")))
    dist.init_process_group("gloo", timeout=timeout)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
