"""Build configuration beyond pyproject.toml: the optional compiled accelerators.

- The C accelerator of the capture ring (and the recorder's C fast path). ``optional=True``:
  without a C compiler the install still succeeds and the recorder uses the Python ring
  (nccl_doctor/capture/ring.py), which writes the same bytes, more slowly.
- Who sent a signal to `nccl-doctor run` (nccl_doctor/supervisor/_senders.c): a SA_SIGINFO
  handler in front of Python's. Optional: without it the report names the signal, not its sender.
- The functional collectives' C++ kernel (nccl_doctor/rank/recorder/_functional_kernel.cpp),
  built against torch's headers and libraries, so only where torch is importable here: `make
  install` runs ``setup.py build_ext --inplace`` once pip has installed torch (pip's isolated
  build has no torch and leaves it out). Also optional: without it (no C++ compiler, no torch
  headers) the Python kernel records the same calls. The build records the torch it is for
  (NCCL_DOCTOR_BUILT_FOR); the recorder refuses it under any other torch
  (nccl_doctor/rank/recorder/functional_kernel.py).
"""

import os

from setuptools import Extension, setup


def functional_kernel() -> list:
    """The C++ kernel's extension, for the torch importable here; none without torch."""
    try:
        import torch
        from torch.utils import cpp_extension
    except ImportError:
        return []
    # functional_kernel.built_for: the torch version and the git revision it was built from
    built_for = f"{torch.__version__} {getattr(torch.version, 'git_version', 'unknown')}"
    abi = int(getattr(torch._C, "_GLIBCXX_USE_CXX11_ABI", True))
    return [
        Extension(
            "nccl_doctor.rank.recorder._functional_kernel",
            sources=["nccl_doctor/rank/recorder/_functional_kernel.cpp"],
            include_dirs=cpp_extension.include_paths(),
            library_dirs=[os.path.join(os.path.dirname(torch.__file__), "lib")],
            libraries=["c10", "torch_cpu", "torch_python"],
            define_macros=[("NCCL_DOCTOR_BUILT_FOR", f'"{built_for}"'),
                           ("_GLIBCXX_USE_CXX11_ABI", str(abi))],
            extra_compile_args=["-O2", "-g0", "-std=c++20", "-fvisibility=hidden"],
            language="c++",
            optional=True,
        )
    ]


setup(
    ext_modules=[
        Extension(
            "nccl_doctor.capture._ring",
            sources=["nccl_doctor/capture/_ring.c"],
            extra_compile_args=["-O2"],
            optional=True,
        ),
        # who sent the signals `run` forwards (nccl_doctor/supervisor/signals.py); optional
        Extension(
            "nccl_doctor.supervisor._senders",
            sources=["nccl_doctor/supervisor/_senders.c"],
            extra_compile_args=["-O2"],
            optional=True,
        ),
    ] + functional_kernel()
)
