"""Which source files belong to torch and the libraries that wrap it (for callsites).

Used by the recorder's hot path (through a per-code-object cache) and by the readers of stacks.
"""

from __future__ import annotations

import functools
import os
import re

#: Top-level packages whose frames are never "the user's line": torch itself, and the libraries that
#: wrap torch.distributed on the user's behalf.
WRAPPER_PACKAGES = ("torch", "accelerate", "deepspeed", "transformers", "trl", "nccl_doctor")
_INTERNAL = ("torch", "nccl_doctor")  # frames never shown even as the direct API caller

_SEP = re.escape(os.sep)


def _pattern(packages: tuple[str, ...]) -> re.Pattern[str]:
    names = "|".join(re.escape(p) for p in packages)
    return re.compile(rf"{_SEP}(?:{names}){_SEP}|^<frozen |^<string>$")


_WRAPPER_RE = _pattern(WRAPPER_PACKAGES)
_INTERNAL_RE = _pattern(_INTERNAL)
# nccl_doctor.plugins is installed from the repository's top-level plugins/ (pyproject.toml's
# package-dir): in an editable install its files lie outside nccl_doctor/, and are ours all the same
_PLUGINS_DIR = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "plugins")
_OWN_DIRS = (_PLUGINS_DIR + os.sep,) if os.path.isfile(
    os.path.join(_PLUGINS_DIR, "known_issues.py")) else ()


def is_wrapper_file(path: str) -> bool:
    """True for torch, the wrapping libraries, nccl_doctor itself and frozen importlib frames."""
    return _belongs(path, _WRAPPER_RE, WRAPPER_PACKAGES)


def is_internal_file(path: str) -> bool:
    """True for torch, nccl_doctor and frozen frames: never the direct caller worth naming."""
    return _belongs(path, _INTERNAL_RE, _INTERNAL)


def _belongs(path: str, pattern: re.Pattern[str], packages: tuple[str, ...]) -> bool:
    """An installed file belongs to the top-level package it is installed as (so
    ray/train/torch/config.py is Ray's, not torch's); any other file by a directory of one of
    ``packages``' names on its path (a source checkout of torch)."""
    if _is_own(path):
        return True
    if _is_user_copy(path):
        return False
    package = package_of(path)
    if package is not None:
        return package in packages
    return bool(pattern.search(path))


_DOCTOR_RE = re.compile(rf"{_SEP}nccl_doctor{_SEP}")


def is_doctor_file(path: str) -> bool:
    """True for nccl-doctor's own code (its recorder's wrappers, the in-rank agent, the capture
    writer they call), not for the example, reproducer and trainer programs it ships: in a rank's
    stack its frames are never where the user's program is, only where the doctor sits around it."""
    return (bool(_DOCTOR_RE.search(path)) and not _is_user_copy(path)) or _is_own(path)


def _is_own(path: str) -> bool:
    return bool(_OWN_DIRS) and path.startswith(_OWN_DIRS)


_STDLIB_RE = re.compile(rf"{_SEP}lib{_SEP}python3\.\d+{_SEP}(?!(?:site|dist)-packages{_SEP})")


def is_stdlib_file(path: str) -> bool:
    """True for the standard library of any CPython 3 install (threading.py, queue.py, ...)."""
    return bool(_STDLIB_RE.search(path))


#: Library files that only pass a call on to torch.distributed (gather helpers, comm shims): a
#: call path's frame in one of them never "issued" the call - the frame that called them did.
THIN_WRAPPER_FILES = (
    "accelerate/utils/operations.py", "accelerate/utils/other.py", "accelerate/accelerator.py",
    "accelerate/state.py",
    "deepspeed/comm/", "lightning_fabric/utilities/distributed.py",
    "lightning/fabric/utilities/distributed.py", "torchmetrics/utilities/distributed.py",
)
_THIN_RE = re.compile("|".join(
    rf"{_SEP}{re.escape(f).replace('/', _SEP)}" for f in THIN_WRAPPER_FILES))


@functools.lru_cache(maxsize=4096)
def is_thin_wrapper(path: str) -> bool:
    """True for a file that only passes a collective on (``THIN_WRAPPER_FILES``), the standard
    library (functools, contextlib, threading) and nccl-doctor's own frames."""
    return bool(_THIN_RE.search(path)) or is_stdlib_file(path) or is_internal_file(path)


_PACKAGE_RE = re.compile(rf"{_SEP}(?:site|dist)-packages{_SEP}([A-Za-z_][A-Za-z0-9_]*)")


@functools.lru_cache(maxsize=4096)
def package_of(path: str) -> str | None:
    """The installed top-level package a file belongs to (``trl`` for
    .../site-packages/trl/trainer/cpo_trainer.py); None for a file not installed as one (the
    user's own code, an editable checkout)."""
    m = _PACKAGE_RE.search(path)
    return m.group(1) if m else None


_USER_COPIES = tuple(f"{os.sep}nccl_doctor{os.sep}{d}{os.sep}"
                     for d in ("examples", "reproducers", "trainers"))


def _is_user_copy(path: str) -> bool:
    # nccl_doctor ships example programs, reproducers and reference trainers; they are "user
    # code" for callsites.
    return any(d in path for d in _USER_COPIES)


def short_path(path: str, cwd: str | None = None) -> str:
    """A path relative to ``cwd`` when it lies below it, else as recorded."""
    return _short_path(path, cwd or os.getcwd())


@functools.lru_cache(maxsize=4096)
def _short_path(path: str, cwd: str) -> str:  # (reports name the same few files thousands of times)
    try:
        rel = os.path.relpath(path, cwd)
    except ValueError:
        return path
    return path if rel.startswith("..") else rel
