"""Ray's own hooks put the recorder into every Ray worker of a job, on every node.

``nccl-doctor run --ray`` sets Ray's ``RAY_RUNTIME_ENV_HOOK`` to ``runtime_env_hook`` for the
driver it launches. Ray calls it at the driver's ``ray.init``; it adds to the job's runtime_env
the doctor's settings (``env_vars``: the ``NCCL_DOCTOR_*`` of the driver) and ``setup_worker`` as
the ``worker_process_setup_hook``, which Ray runs in each worker process it starts for the job,
on whichever node. Workers started by a raylet that ``ray start`` launched long before are
recorded so, with no change to the user's code. Both hooks must never fail the job: what goes
wrong is one line on stderr, and the job runs unrecorded.
"""

from __future__ import annotations

import functools
import importlib
import os
import sys
from typing import Any, Callable

from nccl_doctor import env

#: Ray's name for this module's worker hook.
SETUP_WORKER = f"{__name__}.setup_worker"


def runtime_env_hook(runtime_env: dict[str, Any] | None) -> dict[str, Any] | None:
    """The job's runtime_env with the doctor's settings and worker hook added (the user's own
    RAY_RUNTIME_ENV_HOOK, kept in NCCL_DOCTOR_RAY_USER_HOOK, amends it first). What the user set
    wins: an env var they give keeps their value; their worker setup hook runs after ours."""
    try:
        theirs = os.environ.get(env.RAY_USER_HOOK)
        if theirs:
            runtime_env = _load(theirs)(runtime_env)
        out = dict(runtime_env or {})
        env_vars = dict(out.get("env_vars") or {})
        for name, value in os.environ.items():
            if name.startswith("NCCL_DOCTOR_") and name not in env.RAY_NOT_PASSED:
                env_vars.setdefault(name, value)
        out["env_vars"] = env_vars
        hook = out.get("worker_process_setup_hook")
        out["worker_process_setup_hook"] = (
            SETUP_WORKER if hook is None or hook == SETUP_WORKER
            else functools.partial(setup_worker_then, hook))
        return out
    except Exception as err:  # noqa: BLE001 - ray.init must go on
        sys.stderr.write(f"nccl-doctor: Ray's workers will run unrecorded ({err!r})\n")
        return runtime_env


def setup_worker() -> None:
    """In each Ray worker of the job: arm the recorder, writing into this host's directory."""
    try:
        from nccl_doctor.rank import bootstrap  # (it writes into this host's directory)

        bootstrap.activate()
    except Exception as err:  # noqa: BLE001 - the worker must start regardless
        sys.stderr.write(f"nccl-doctor: recorder not started in this Ray worker ({err!r}); "
                         "it runs unrecorded\n")


def setup_worker_then(theirs: str | Callable[[], Any]) -> None:
    """Our worker hook, then the user's (a callable, or its "module.function" name)."""
    setup_worker()
    (_load(theirs) if isinstance(theirs, str) else theirs)()


def _load(path: str) -> Callable[..., Any]:
    module, _, name = path.rpartition(".")
    return getattr(importlib.import_module(module), name)

