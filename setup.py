"""Build configuration beyond pyproject.toml: the optional C accelerator of the capture ring.

``optional=True``: without a C compiler the install still succeeds and the recorder uses the
Python ring (nccl_doctor/capture/ring.py), which writes the same bytes, more slowly.
"""

from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension(
            "nccl_doctor.capture._ring",
            sources=["nccl_doctor/capture/_ring.c"],
            extra_compile_args=["-O2"],
            optional=True,
        )
    ]
)
