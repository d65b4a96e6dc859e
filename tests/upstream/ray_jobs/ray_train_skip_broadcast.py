"""A Ray Train job that hangs: TorchTrainer, 2 CPU workers (gloo); after a few DDP steps world
rank 1 skips a dist.broadcast that rank 0 makes, so rank 0 waits in the broadcast and rank 1 in
the dist.barrier() that follows. Nothing in it ends by itself before torch's gloo timeout
(TorchConfig(timeout_s=...), default here 1800 s): under `nccl-doctor run` the watchdog
diagnoses the hang and stops the job.

Standalone: `python ray_train_skip_broadcast.py [--steps N] [--timeout-s S] [--address ADDR]`.
"""

import argparse
import os
import sys

from ray_driver import fit, quiet_ray

quiet_ray()  # before ray is imported


def train_func(config):
    import threading

    import torch
    import torch.distributed as dist
    import ray.train
    import ray.train.torch

    rank = ray.train.get_context().get_world_rank()
    print(f"[worker rank={rank} pid={os.getpid()} thread={threading.current_thread().name}"
          f" ident={threading.get_ident()} main_ident={threading.main_thread().ident}]",
          flush=True)
    torch.manual_seed(0)
    model = ray.train.torch.prepare_model(torch.nn.Linear(8, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    for _ in range(config["steps"]):
        loss = model(torch.randn(16, 8)).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
    weights = torch.zeros(4)
    if rank == 0:
        weights += 1.0
    if rank != 1:  # the bug: world rank 1 skips the broadcast
        print(f"[worker rank={rank}] broadcast", flush=True)
        dist.broadcast(weights, src=0)
    print(f"[worker rank={rank}] barrier", flush=True)
    dist.barrier()
    ray.train.report({"weights": weights.sum().item()})


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--timeout-s", type=int, default=1800, help="TorchConfig(timeout_s=...)")
    p.add_argument("--address", default=None)
    p.add_argument("--spread", action="store_true", help="one worker per node (a cluster)")
    args = p.parse_args()
    error = fit(train_func, "ray_train_skip_broadcast", {"steps": args.steps},
                timeout_s=args.timeout_s, address=args.address, spread=args.spread)
    return 0 if error is None else 1


if __name__ == "__main__":
    sys.exit(main())
