"""A healthy Ray Train job: TorchTrainer, 2 CPU workers (gloo), a tiny DDP model, a few steps.

Standalone: `python ray_train_healthy.py` starts a local Ray, trains, shuts Ray down, exits 0.
Under the doctor: `nccl-doctor run --out OUT -- python tests/upstream/ray_jobs/ray_train_healthy.py`.
Options: --steps N, --workers N (default 2; with 1, Ray Train never calls destroy_process_group:
ray/train/torch/config.py passes destroy_process_group=len(worker_group) > 1), --address ADDR
(an existing cluster, e.g. "auto" after `ray start --head`).
"""

import argparse
import os
import sys
import time

from ray_driver import fit, quiet_ray

quiet_ray()  # before ray is imported


def train_func(config):
    import threading

    import torch
    import torch.distributed as dist
    import ray.train
    import ray.train.torch

    ctx = ray.train.get_context()
    rank = ctx.get_world_rank()
    print(f"[worker rank={rank} pid={os.getpid()} thread={threading.current_thread().name}"
          f" ident={threading.get_ident()} main_ident={threading.main_thread().ident}"
          f" backend={dist.get_backend()} world={dist.get_world_size()}"
          f" started {time.time() - config['fit_started']:.1f}s after fit()]", flush=True)
    torch.manual_seed(0)
    model = ray.train.torch.prepare_model(torch.nn.Linear(8, 1))  # DDP on gloo
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    for step in range(config["steps"]):
        x = torch.randn(16, 8)
        loss = model(x).pow(2).mean()
        opt.zero_grad()
        loss.backward()  # DDP's all_reduce of the gradients
        opt.step()
    t = torch.tensor([float(rank)])
    dist.all_reduce(t)
    ray.train.report({"loss": loss.item(), "sum_ranks": t.item()})


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=5)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--address", default=None)
    args = p.parse_args()
    error = fit(train_func, "ray_train_healthy", {"steps": args.steps, "fit_started": time.time()},
                workers=args.workers, address=args.address)
    return 0 if error is None else 1


if __name__ == "__main__":
    sys.exit(main())
