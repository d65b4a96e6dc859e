"""numpy imported with one BLAS thread, for this process only.

The doctor's own processes (the supervisor, replay) use numpy for columns of records, never for
linear algebra, yet a numpy wheel's OpenBLAS starts one thread per core when it is loaded: about
50 ms of CPU on a 2-core machine, at every run, beside the job's ranks. The thread count is read
from the environment when the library is loaded, so it is set around the first import and the
environment given back as it was: the job's processes (launched from a copy taken earlier, or
later from this environment) keep the user's settings.
"""

from __future__ import annotations

import importlib
import os
import sys

#: the variables the BLAS builds numpy ships with read (OpenBLAS, pthreads or OpenMP; MKL)
_THREAD_VARIABLES = ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS")


def import_numpy() -> None:
    """Import numpy, its BLAS on one thread unless the user chose a count; a no-op once numpy is
    imported (or when it cannot be: the caller's own import says so)."""
    if "numpy" in sys.modules:
        return
    unset = [name for name in _THREAD_VARIABLES if name not in os.environ]
    for name in unset:
        os.environ[name] = "1"
    try:
        importlib.import_module("numpy")
    except ImportError:
        pass
    finally:
        for name in unset:
            os.environ.pop(name, None)
