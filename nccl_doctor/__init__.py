"""nccl-doctor: diagnose hangs and silent errors in distributed PyTorch training.

Importing this package is cheap (no torch): the job's every Python process loads it.
"""

from __future__ import annotations

import os
from pathlib import Path

from nccl_doctor._version import __version__

__all__ = ["__version__", "install"]


def install(directory: str | os.PathLike[str] | None = None) -> Path:
    """Record this process's torch.distributed calls without ``nccl-doctor run``.

    Captures go to ``directory`` (default: ``$NCCL_DOCTOR_DIR``, else ``./nccl-doctor-capture``);
    replay them with ``nccl-doctor replay DIR``. Safe to call before or after
    ``init_process_group``, and more than once.
    """
    from nccl_doctor import env
    from nccl_doctor.recorder import bootstrap

    chosen = Path(directory or os.environ.get(env.CAPTURE_DIR) or "nccl-doctor-capture")
    return bootstrap.install(chosen).directory
