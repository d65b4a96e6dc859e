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
import tempfile
import time

# Quiet, cheap start-up; set before ray is imported (the workers inherit them from the raylet).
os.environ.setdefault("RAY_DEDUP_LOGS", "0")
os.environ.setdefault("RAY_AUTH_MODE", "disabled")  # no token file written under ~/.ray
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
os.environ.setdefault("RAY_TRAIN_ENABLE_STATE_ACTOR_RECONCILIATION", "0")
os.environ.setdefault("RAY_TRAIN_ENABLE_PREEMPTION_WATCHER", "0")  # one actor fewer to start
os.environ.setdefault("RAY_TRAIN_ENABLE_PRINT_PATCH", "0")  # worker prints once, not twice
os.environ.setdefault("RAY_TRAIN_METRICS_ENABLED", "0")

T0 = time.time()


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

    import ray
    from ray.train import RunConfig, ScalingConfig
    from ray.train.torch import TorchConfig, TorchTrainer

    t_import = time.time()
    if args.address:
        ray.init(address=args.address)
    else:
        ray.init(num_cpus=3, include_dashboard=False, log_to_driver=True)
    t_init = time.time()
    trainer = TorchTrainer(
        train_func,
        train_loop_config={"steps": args.steps, "fit_started": time.time()},
        scaling_config=ScalingConfig(num_workers=args.workers, use_gpu=False),
        torch_config=TorchConfig(backend="gloo"),
        run_config=RunConfig(name="ray_train_healthy",
                             storage_path=os.path.join(tempfile.gettempdir(), "ray-results")),
    )
    result = trainer.fit()
    t_fit = time.time()
    print(f"[driver] metrics={result.metrics} error={result.error}", flush=True)
    ray.shutdown()
    t_end = time.time()
    print(f"[driver] import {t_import - T0:.2f}s ray.init {t_init - t_import:.2f}s "
          f"fit {t_fit - t_init:.2f}s shutdown {t_end - t_fit:.2f}s total {t_end - T0:.2f}s",
          flush=True)
    return 0 if result.error is None else 1


if __name__ == "__main__":
    sys.exit(main())
