"""A training-like loop on several hosts where one host is slow: every step, the ranks of host
SLOW_HOST spend SLOW_SECONDS more before the step's collectives (SLOW_HOW "sleep": a stalled
input pipeline; "burn": CPU-bound work, as a throttled or contended host), then every rank
all-reduces its gradients and a loss. STEPS steps (default 20), PAUSE seconds of "compute" each
(default 0.1). No SLOW_HOST: a healthy job. The host is the one nccl-doctor names
(NCCL_DOCTOR_HOSTNAME, else Slurm's node name, else the system's)."""

import os
import socket
import sys
import time

import torch
import torch.distributed as dist


def host() -> str:
    return (os.environ.get("NCCL_DOCTOR_HOSTNAME") or os.environ.get("SLURMD_NODENAME")
            or socket.gethostname())


def fetch_batch(seconds: float, how: str) -> None:
    if how == "burn":
        end, x = time.monotonic() + seconds, 0.0
        while time.monotonic() < end:
            x += sum(i * 0.5 for i in range(1000))
    else:
        time.sleep(seconds)


def main() -> None:
    if "RANK" not in os.environ and "SLURM_PROCID" in os.environ:  # one Slurm task per rank
        os.environ.update(RANK=os.environ["SLURM_PROCID"], WORLD_SIZE=os.environ["SLURM_NTASKS"])
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    steps = int(os.environ.get("STEPS", "20"))
    pause = float(os.environ.get("PAUSE", "0.1"))
    slow = os.environ.get("SLOW_HOST", "")
    slow_s = float(os.environ.get("SLOW_SECONDS", "0"))
    how = os.environ.get("SLOW_HOW", "sleep")
    me = host()
    grads = torch.ones(256)
    for step in range(steps):
        time.sleep(pause)  # forward and backward
        if me == slow:
            fetch_batch(slow_s, how)
        dist.all_reduce(grads)
        loss = torch.tensor([float(step)])
        dist.all_reduce(loss)
    sys.stdout.write(f"rank {rank} on {me}: done\n")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
