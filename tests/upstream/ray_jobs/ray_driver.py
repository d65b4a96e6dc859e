"""What the Ray jobs' drivers share: quiet, cheap start-up settings and a TorchTrainer fit.

Only drivers import this: a Ray Train training function is pickled by value from its job's
``__main__`` and must not refer to anything here (the workers could not import it).
"""

from __future__ import annotations

import os
import tempfile
import time
from typing import Any, Callable

#: Set before ray is imported (the workers inherit them from the raylet): no duplicated log
#: lines, no token file under ~/.ray, no usage report, none of Ray Train's extra threads.
RAY_DEFAULTS = {
    "RAY_DEDUP_LOGS": "0", "RAY_AUTH_MODE": "disabled", "RAY_USAGE_STATS_ENABLED": "0",
    "RAY_TRAIN_ENABLE_STATE_ACTOR_RECONCILIATION": "0",
    "RAY_TRAIN_ENABLE_PREEMPTION_WATCHER": "0", "RAY_TRAIN_ENABLE_PRINT_PATCH": "0",
    "RAY_TRAIN_METRICS_ENABLED": "0",
}
T0 = time.time()


def quiet_ray() -> None:
    for key, value in RAY_DEFAULTS.items():
        os.environ.setdefault(key, value)


def start_ray(address: str | None = None, **kwargs: Any) -> None:
    """A local Ray (3 CPUs, no dashboard), or the cluster at ``address``."""
    import ray

    if address:
        ray.init(address=address, **kwargs)
    else:
        ray.init(num_cpus=3, include_dashboard=False, log_to_driver=True, **kwargs)


def fit(train_func: Callable[[dict], None], name: str, config: dict, *, workers: int = 2,
        timeout_s: int = 1800, address: str | None = None,
        spread: bool = False) -> BaseException | None:
    """``train_func`` on a TorchTrainer of ``workers`` CPU workers (gloo, no retry; ``spread``:
    on as many nodes); Ray is started and shut down around it. Returns the error the fit ended
    with (None: success)."""
    import ray
    from ray.train import FailureConfig, RunConfig, ScalingConfig
    from ray.train.torch import TorchConfig, TorchTrainer

    t_import = time.time()
    start_ray(address)
    t_init = time.time()
    trainer = TorchTrainer(
        train_func, train_loop_config=config,
        scaling_config=ScalingConfig(num_workers=workers, use_gpu=False,
                                     placement_strategy="SPREAD" if spread else "PACK"),
        torch_config=TorchConfig(backend="gloo", timeout_s=timeout_s),
        run_config=RunConfig(name=name, failure_config=FailureConfig(max_failures=0),
                             storage_path=os.path.join(tempfile.gettempdir(), "ray-results")))
    try:
        error = trainer.fit().error
    except Exception as err:  # TrainingFailedError once a worker failed
        error = err
    t_fit = time.time()
    print(f"[driver] error={type(error).__name__ if error else None}: {str(error)[:300]!r}",
          flush=True)
    ray.shutdown()
    print(f"[driver] import {t_import - T0:.2f}s ray.init {t_init - t_import:.2f}s fit "
          f"{t_fit - t_init:.2f}s total {time.time() - T0:.2f}s", flush=True)
    return error
