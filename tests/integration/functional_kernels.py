"""The two kernels that record the functional collectives (rank/recorder/functional.py), for the
tests that run their jobs under each: ``kernel_env`` is the environment that asks a rank for one.

The C++ kernel must be built where it can be: asked for where it cannot be used, a test fails -
unless this machine has no C++ compiler or torch no headers to build it with, where it is
skipped with the reason - and never skipped on CI (``CI`` set), where make install builds it."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

KERNELS = ("cpp", "python")


def cpp_kernel_unavailable() -> str | None:
    """None when the C++ kernel can be used here; else why not, when it cannot even be built
    here (no compiler, no torch headers, not CI). Fails the test otherwise."""
    import torch

    from nccl_doctor.rank.recorder import functional_kernel

    try:
        functional_kernel.load(torch)
        return None
    except functional_kernel.KernelUnavailable as err:
        why = str(err)
    headers = Path(torch.__file__).parent / "include" / "torch" / "library.h"
    compiler = os.environ.get("CXX") or "c++"
    if os.environ.get("CI") or (shutil.which(compiler) and headers.exists()):
        pytest.fail(f"the C++ kernel can be built here (make install), but cannot be used: {why}")
    return why


def kernel_env(kernel: str) -> dict[str, str]:
    """The environment asking a rank for ``kernel``; skips a C++ test where no C++ kernel can
    be built."""
    if kernel == "cpp":
        why = cpp_kernel_unavailable()
        if why is not None:
            pytest.skip(f"no C++ compiler or no torch headers here to build the C++ kernel: {why}")
    return {"NCCL_DOCTOR_FUNCTIONAL_KERNEL": kernel}
