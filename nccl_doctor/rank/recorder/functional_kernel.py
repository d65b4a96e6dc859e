"""Which kernel records the functional collectives (rank/recorder/functional.py): the C++ one
(``_functional_kernel.cpp``), where it was built for the torch this process runs, else the
Python one - the same records either way, the C++ one at under a third of the cost per call
(docs/benchmarks/functional_overhead.md).

The C++ kernel is built by ``make install`` (setup.py, once torch is installed: a compiler and
torch's headers are all it needs) and never at run time: a build inside a rank would cost a
training job its first minute. A build is for one torch: its version and git revision are
compiled into the file, read here before the file is loaded (a build for another torch may not
even link against this one's libraries) and checked again once it is. Any other torch, no build,
or ``NCCL_DOCTOR_FUNCTIONAL_KERNEL=python``: the Python kernel.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
from pathlib import Path
from typing import Any

#: ``auto`` (the default): the C++ kernel where it is built for this torch, else the Python one;
#: ``python``: the Python one; ``cpp``: the C++ one or none (the functional collectives then go
#: unrecorded, with a line on stderr saying why: what the tests of the C++ kernel ask for).
KERNEL_ENV = "NCCL_DOCTOR_FUNCTIONAL_KERNEL"
CHOICES = ("auto", "cpp", "python")
MODULE = "nccl_doctor.rank.recorder._functional_kernel"
#: What the build writes into the file before the torch it was built for (see the .cpp).
MARKER = b"nccl-doctor functional kernel built for torch "


class KernelUnavailable(Exception):
    """The C++ kernel cannot be used in this process; the message says why, as a clause that
    follows "the C++ kernel cannot be used: ". ``stale``: a build is there, for another torch
    (or an older ring) - what a rank says on stderr, as make install would mend it."""

    def __init__(self, why: str, stale: bool = False) -> None:
        super().__init__(why)
        self.stale = stale


def wanted() -> str:
    """The kernel asked for: one of CHOICES (an unknown value reads as ``auto``)."""
    value = os.environ.get(KERNEL_ENV, "").strip().lower() or "auto"
    return value if value in CHOICES else "auto"


def built_for(torch: Any) -> str:
    """What a build for this torch records (setup.py writes the same)."""
    return f"{torch.__version__} {getattr(torch.version, 'git_version', 'unknown')}"


def recorded_in(path: Path) -> str | None:
    """The torch a built file says it was built for, read without loading it."""
    try:
        data = path.read_bytes()
    except OSError:
        return None
    at = data.find(MARKER)
    if at < 0:
        return None
    end = data.find(b"\n", at)
    return data[at + len(MARKER):end].decode("utf-8", "replace") if end > 0 else None


def load(torch: Any) -> Any:
    """The C++ kernel's module, built for this torch; raises KernelUnavailable saying why not."""
    try:
        spec = importlib.util.find_spec(MODULE)
    except (ImportError, ValueError):
        spec = None
    if spec is None or not spec.origin:
        raise KernelUnavailable("not built (make install builds it where a C++ compiler "
                                "and torch's headers are)")
    want = built_for(torch)
    found = recorded_in(Path(spec.origin))
    if found != want:
        raise KernelUnavailable(f"{spec.origin} was built for torch {found or '(unknown)'}, not "
                                f"this one ({want}): make install builds it again", stale=True)
    try:
        from nccl_doctor.capture import _ring  # its C API: the recorder's C fast path
    except ImportError:
        raise KernelUnavailable("nccl_doctor.capture._ring, the recorder's C fast path it "
                                "records through, is not built") from None
    if not hasattr(_ring, "_C_API"):
        raise KernelUnavailable("nccl_doctor.capture._ring is an older build without its C API: "
                                "make install builds it again", stale=True)
    try:
        module = importlib.import_module(MODULE)
    except ImportError as err:
        raise KernelUnavailable(f"{spec.origin} does not load: {err}", stale=True) from None
    if getattr(module, "BUILT_FOR", None) != want:
        raise KernelUnavailable(f"{spec.origin} says it was built for torch "
                                f"{getattr(module, 'BUILT_FOR', None)}, not {want}", stale=True)
    return module
