"""A Ray Train job whose world rank 1 raises in its training function (after its collectives;
with --peer-waits, rank 0 then waits in an all_reduce rank 1 never joins). Ray Train catches the
exception in its TrainingThread (ray/train/v2/_internal/execution/worker_group/thread_runner.py),
so it never reaches sys.excepthook; the controller then tears the worker group down (its torch
backend calls dist.destroy_process_group on every worker, then ray.kill) and fit() fails.

    python ray_train_raises.py [--peer-waits]      # exits 1
"""

import argparse
import os
import sys
import tempfile

os.environ.setdefault("RAY_DEDUP_LOGS", "0")
os.environ.setdefault("RAY_AUTH_MODE", "disabled")
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
os.environ.setdefault("RAY_TRAIN_ENABLE_STATE_ACTOR_RECONCILIATION", "0")
os.environ.setdefault("RAY_TRAIN_ENABLE_PREEMPTION_WATCHER", "0")
os.environ.setdefault("RAY_TRAIN_ENABLE_PRINT_PATCH", "0")
os.environ.setdefault("RAY_TRAIN_METRICS_ENABLED", "0")


def train_func(config):
    import torch
    import torch.distributed as dist
    import ray.train

    rank = ray.train.get_context().get_world_rank()
    t = torch.ones(4)
    dist.all_reduce(t)
    if rank == 1:
        raise RuntimeError("rank 1 failed on purpose")
    if config["peer_waits"]:
        dist.all_reduce(t)  # rank 1 is gone: waits until the teardown or the gloo timeout


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--peer-waits", action="store_true")
    p.add_argument("--timeout-s", type=int, default=1800, help="TorchConfig(timeout_s=...)")
    args = p.parse_args()

    import ray
    from ray.train import FailureConfig, RunConfig, ScalingConfig
    from ray.train.torch import TorchConfig, TorchTrainer

    ray.init(num_cpus=3, include_dashboard=False, log_to_driver=True)
    trainer = TorchTrainer(
        train_func,
        train_loop_config={"peer_waits": args.peer_waits},
        scaling_config=ScalingConfig(num_workers=2, use_gpu=False),
        torch_config=TorchConfig(backend="gloo", timeout_s=args.timeout_s),
        run_config=RunConfig(name="ray_train_raises", failure_config=FailureConfig(max_failures=0),
                             storage_path=os.path.join(tempfile.gettempdir(), "ray-results")),
    )
    try:
        error = trainer.fit().error
    except Exception as err:  # TrainingFailedError
        error = err
    print(f"[driver] error={type(error).__name__}: {str(error)[:300]!r}", flush=True)
    ray.shutdown()
    return 0 if error is None else 1


if __name__ == "__main__":
    sys.exit(main())
