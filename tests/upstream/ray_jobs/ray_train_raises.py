"""A Ray Train job whose world rank 1 raises in its training function (after its collectives;
with --peer-waits, rank 0 then waits in an all_reduce rank 1 never joins). Ray Train catches the
exception in its TrainingThread (ray/train/v2/_internal/execution/worker_group/thread_runner.py),
so it never reaches sys.excepthook; the controller then tears the worker group down (its torch
backend calls dist.destroy_process_group on every worker, then ray.kill) and fit() fails.

    python ray_train_raises.py [--peer-waits]      # exits 1
"""

import argparse
import sys

from ray_driver import fit, quiet_ray

quiet_ray()  # before ray is imported


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
    error = fit(train_func, "ray_train_raises", {"peer_waits": args.peer_waits},
                timeout_s=args.timeout_s)
    return 0 if error is None else 1


if __name__ == "__main__":
    sys.exit(main())
