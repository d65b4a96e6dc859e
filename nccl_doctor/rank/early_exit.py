"""A rank that raises before it joins a process group: its exception, kept.

The recorder notes a rank's uncaught exception into its capture (rank/recorder/core.py), which
exists once ``init_process_group`` returns. A rank that a config typo, a bad import or a missing
setting ends before that would leave nothing, and the report would say no rank was recorded.
``arm`` (the bootstrap calls it in every process of the job) chains an excepthook that leaves
the record capture/early_exit.py reads, when the process is a rank that has not joined:

- a rank: the launcher's rank variable is set (RANK, OMPI_COMM_WORLD_RANK, SLURM_PROCID, ...;
  LOCAL_RANK at least), or, with none, the process imported torch.distributed and is neither a
  multiprocessing child (its rank is an argument, not known here) nor a launcher: a single
  ``python train.py`` is rank 0 of 1. A process holding a launcher's module (torchrun's agent,
  ``accelerate launch``, DeepSpeed's runner) starts ranks and is never one: its exception
  (torchrun's ChildFailedError) is about them.
- not joined: ``init_process_group`` has not returned in it (after that, the capture notes it).

Only the main thread's exception ends a process, so only ``sys.excepthook`` is chained: a
thread that dies leaves its process running. The hook never changes the exception's output or
the exit status (the previous hook always runs), and never raises.
"""

from __future__ import annotations

import collections
import os
import sys
import time
from typing import Any

from nccl_doctor import env, paths
from nccl_doctor.rank.hooks import exception_fields

#: Modules only a launcher imports: a process holding one starts ranks, it is not one.
LAUNCHERS = ("torch.distributed.run", "torch.distributed.launcher.api",
             "accelerate.commands.launch", "deepspeed.launcher.runner",
             "deepspeed.launcher.launch")


def arm(recorder: Any) -> None:
    """Chain the excepthook that records ``recorder``'s process ending before it joined."""
    previous = sys.excepthook
    pid = os.getpid()

    def excepthook(tp: type, value: BaseException, tb: Any) -> None:
        try:
            # (a forked child, a DataLoader worker, is not the rank: its pid is not this one)
            if os.getpid() == pid and not joined(recorder):
                from nccl_doctor.rank.recorder.core import signals_deferred

                with signals_deferred():
                    record(recorder.directory, tp, value, tb)
        except BaseException:  # noqa: BLE001 - never a second traceback, never a lost one
            pass
        finally:
            previous(tp, value, tb)

    sys.excepthook = excepthook


def joined(recorder: Any) -> bool:
    """The process joined a process group (its capture notes what it raises from then on)."""
    if recorder.writer is not None or getattr(recorder, "joined", False):
        return True
    c10d = sys.modules.get("torch.distributed.distributed_c10d")
    try:
        return c10d is not None and bool(c10d.is_initialized())
    except Exception:  # noqa: BLE001 - a half-imported torch: not joined
        return False


def record(directory: Any, tp: type, value: BaseException, tb: Any) -> Any:
    """Leave the record of this process's exception when it is a rank (module docstring);
    the record's path, or None."""
    here = rank_here()
    if here is None:
        return None
    from nccl_doctor.capture.early_exit import MAX_FRAMES, write_early_exit

    raised = exception_fields(tp, value, tb)
    frames: collections.deque = collections.deque(maxlen=MAX_FRAMES)
    in_init = False
    while tb is not None:
        code = tb.tb_frame.f_code
        if not paths.is_doctor_file(code.co_filename):  # (the recorder's wrappers: not the job)
            frames.appendleft({"path": code.co_filename, "line": tb.tb_lineno,
                               "function": code.co_name})
        # torch's init_process_group (or the recorder's wrapper of it) was on the way
        in_init = in_init or (code.co_name == "init_process_group"
                              and paths.is_internal_file(code.co_filename))
        tb = tb.tb_next
    raised.update(in_init=in_init, traceback=list(frames), time_ns=time.time_ns())
    rank, world = here
    return write_early_exit(directory, rank, world, env.host_name(), raised)


def rank_here() -> tuple[int, int] | None:
    """(rank, world size or 0) of this process when it is a rank (module docstring), else None."""
    if any(name in sys.modules for name in LAUNCHERS):
        return None
    for names in (env.LAUNCHER_RANK, env.LAUNCHER_LOCAL_RANK):
        name = next((n for n in names if n in os.environ), None)
        if name is None:
            continue
        rank = _int(os.environ[name])
        if rank is None or rank < 0:
            return None
        world = next((_int(os.environ[n]) for n in env.LAUNCHER_WORLD_SIZE if n in os.environ),
                     None)
        return rank, world if world is not None and world > rank else 0
    mp = sys.modules.get("multiprocessing")
    if "torch.distributed" in sys.modules and (mp is None or mp.parent_process() is None):
        return 0, 1
    return None


def _int(text: str) -> int | None:
    try:
        return int(text)
    except ValueError:
        return None
