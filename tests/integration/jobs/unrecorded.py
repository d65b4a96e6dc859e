"""A healthy job whose rank UNRECORDED (or every rank: "all") cannot make a file of its capture's
size (RLIMIT_FSIZE, as a full disk would refuse it): its recorder steps aside, the job must not,
and the report must not call the rank missing."""

import os
import resource
import signal

import torch
import torch.distributed as dist


def main() -> None:
    rank = int(os.environ["RANK"])
    if os.environ.get("UNRECORDED", "1") in ("all", str(rank)):  # ("all": every rank)
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # an over-size write fails with EFBIG
        resource.setrlimit(resource.RLIMIT_FSIZE, (64 * 1024, resource.RLIM_INFINITY))
    dist.init_process_group("gloo")
    t = torch.ones(4)
    for _ in range(5):
        dist.all_reduce(t)
        dist.broadcast(t, src=0)
    assert t.sum().item() == 4 * dist.get_world_size() ** 5
    print(f"rank {rank} done", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
