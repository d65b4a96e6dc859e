"""Ray Train: an exception that ends a worker's training function is the rank's end.

Ray Train runs the user's function on a thread of its own (``TrainingThread``) and keeps the
exception it raises for the controller: sys.excepthook never sees it, so the rank would read as
having finished (Ray Train then destroys the process group). The thread runner's target is
wrapped to note the exception (nccl_doctor.rank.hooks.note_exception) before Ray takes it; the
exception goes on exactly as before. Ray Train V2 (Ray 2.50 and later); elsewhere nothing is
patched.
"""

from __future__ import annotations

import functools
from typing import Any, Callable

from nccl_doctor.rank import hooks


def patch_thread_runner(module: Any) -> None:
    runner = getattr(module, "ThreadRunner", None)
    run = getattr(runner, "run", None)
    if run is None or getattr(run, "__nccl_doctor__", False):
        return

    @functools.wraps(run)
    def recorded_run(self: Any, target: Callable[[], Any], *args: Any, **kwargs: Any) -> Any:
        return run(self, _noting(target), *args, **kwargs)

    recorded_run.__nccl_doctor__ = True  # type: ignore[attr-defined]
    runner.run = recorded_run


def _noting(target: Callable[[], Any]) -> Callable[[], Any]:
    @functools.wraps(target)
    def train_fn() -> Any:
        try:
            return target()
        except BaseException as err:
            hooks.note_exception(err)
            raise

    return train_fn
