"""A healthy job whose ranks leave without Python's atexit (os._exit), as Ray's workers and some
launchers end them: after destroy_process_group (DESTROY=1), or straight after the last call."""

import os
import sys

import torch
import torch.distributed as dist


def main() -> None:
    dist.init_process_group("gloo")
    for _ in range(4):
        dist.all_reduce(torch.ones(3))
    dist.barrier()
    if os.environ.get("DESTROY") == "1":
        dist.destroy_process_group()
    sys.stdout.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
