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
import tempfile
import time

os.environ.setdefault("RAY_DEDUP_LOGS", "0")
os.environ.setdefault("RAY_AUTH_MODE", "disabled")
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
os.environ.setdefault("RAY_TRAIN_ENABLE_STATE_ACTOR_RECONCILIATION", "0")
os.environ.setdefault("RAY_TRAIN_ENABLE_PREEMPTION_WATCHER", "0")
os.environ.setdefault("RAY_TRAIN_ENABLE_PRINT_PATCH", "0")
os.environ.setdefault("RAY_TRAIN_METRICS_ENABLED", "0")

T0 = time.time()


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
        train_loop_config={"steps": args.steps},
        scaling_config=ScalingConfig(num_workers=2, use_gpu=False),
        torch_config=TorchConfig(backend="gloo", timeout_s=args.timeout_s),
        run_config=RunConfig(name="ray_train_skip_broadcast",
                             storage_path=os.path.join(tempfile.gettempdir(), "ray-results")),
    )
    try:
        result = trainer.fit()
        error = result.error
    except Exception as err:  # TrainingFailedError once torch's timeout fires
        error = err
    t_fit = time.time()
    print(f"[driver] error={error!r}"[:2000], flush=True)
    ray.shutdown()
    print(f"[driver] import {t_import - T0:.2f}s ray.init {t_init - t_import:.2f}s "
          f"fit {t_fit - t_init:.2f}s total {time.time() - T0:.2f}s", flush=True)
    return 0 if error is None else 1


if __name__ == "__main__":
    sys.exit(main())
