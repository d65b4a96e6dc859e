"""nccl-doctor: diagnose hangs and silent errors in distributed PyTorch training.

Importing this package is cheap (no torch): the job's every Python process loads it.
"""

from __future__ import annotations

import os

from nccl_doctor._version import __version__

TYPE_CHECKING = False  # (typing and pathlib unimported: the job's supervisor's reaper imports
if TYPE_CHECKING:      # this package, with nothing else, at every run)
    from pathlib import Path

    from nccl_doctor.data.job import Job

__all__ = ["__version__", "Job", "install", "mark_step", "observe_completions", "observe_metrics",
           "open", "short_path"]


def open(*paths: str | os.PathLike[str], fr: str | os.PathLike[str] | None = None) -> Job:
    """Open a recorded job for analysis in Python: ``nccl_doctor.open("nccl-doctor-out/run")``.

    ``paths``: a run's ``--out`` directory, every node's directories (or one directory holding
    them), one ``.ndcap`` capture, or a directory of PyTorch Flight Recorder dumps; ``fr``: the
    job's own Flight Recorder dumps to merge (as ``replay --fr``). The ``Job`` has ``calls`` (a
    pandas DataFrame, one row per recorded collective), ``ranks``, ``groups``, ``notes`` and
    ``diagnose()`` (the diagnosis ``nccl-doctor replay`` gives). docs/python-api.md.
    """
    from nccl_doctor.data.job import Job
    return Job(*paths, fr=fr)


def short_path(path: str) -> str:
    """A file, or a ``path:line``, as the reports print it: an installed file from its package
    root (``.../site-packages/trl/trainer/x.py:8`` -> ``trl/trainer/x.py:8``), one below the
    working directory relative to it, any other as it is. ``Job.calls``'s ``callsite``,
    ``api_callsite`` and ``issuing`` hold absolute paths:
    ``calls["callsite"].map(nccl_doctor.short_path)`` is what the reports say. docs/python-api.md.
    """
    from nccl_doctor import paths
    return paths.short_path(path)


def __getattr__(name: str) -> object:
    if name == "Job":  # pandas is imported only when asked for
        from nccl_doctor.data.job import Job
        return Job
    raise AttributeError(f"module 'nccl_doctor' has no attribute {name!r}")


def install(directory: str | os.PathLike[str] | None = None) -> Path:
    """Record this process's torch.distributed calls without ``nccl-doctor run``.

    Captures go to ``directory`` (default: ``$NCCL_DOCTOR_DIR``, else ``./nccl-doctor-capture``);
    replay them with ``nccl-doctor replay DIR``. Safe to call before or after
    ``init_process_group``, and more than once.
    """
    from pathlib import Path

    from nccl_doctor import env
    from nccl_doctor.rank import bootstrap
    chosen = Path(directory or os.environ.get(env.CAPTURE_DIR) or "nccl-doctor-capture")
    return bootstrap.install(chosen).directory


def observe_completions(completions: object, prompts: object = None, *, sampling: bool = True,
                        step: int | None = None) -> bool:
    """Record hashes of one batch of generations for the cross-rank comparison.

    ``completions``: strings, token-id lists or a 2-D tensor of the new tokens; ``prompts`` the
    same for their prompts (optional: with them, "same prompt + same seed" is told apart).
    ``sampling=False`` says the decoding was deterministic (greedy, temperature 0): identical
    outputs are then expected. transformers' ``generate`` and vLLM's ``LLM.generate`` are
    recorded automatically. Returns False (and does nothing) outside nccl-doctor; never raises.
    """
    from nccl_doctor.rank import hooks
    return hooks.observe_completions(completions, prompts, sampling=sampling, step=step)


def observe_metrics(step: int | None, metrics: dict) -> bool:
    """Record the training metrics logged at ``step`` (loss, reward, reward_std, kl, ...).
    Trainers of transformers/TRL are recorded automatically."""
    from nccl_doctor.rank import hooks
    return hooks.observe_metrics(step, metrics)


def mark_step(step: int | None = None) -> bool:
    """Mark a training step: records each RNG state's fingerprint (a hash, never the state)."""
    from nccl_doctor.rank import hooks
    return hooks.mark_step(step)
