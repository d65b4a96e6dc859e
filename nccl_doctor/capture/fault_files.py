"""The faulthandler files beside the captures (``<capture>.fault``, format.FAULT_SUFFIX).

Every rank opens its file at start, before anything can crash: a fatal signal then leaves the
rank's Python stack there (a SIGSEGV in an extension; a SIGABRT in interpreter teardown, after
every atexit hook has run, which is why a rank cannot tidy its own file). A rank that ended
without a fault leaves the file empty; the supervisor drops those once the job is over.
"""

from __future__ import annotations

import stat
from pathlib import Path

from nccl_doctor.capture import format as fmt

__all__ = ["drop_empty_fault_files"]


def drop_empty_fault_files(directory: Path) -> list[Path]:
    """Remove the empty fault files of ``directory``'s captures; the paths removed.

    Call it only once no rank of the job can run any more (a rank still alive would fault into a
    file that no longer has a name). Only a regular, empty ``X.fault`` beside an ``X.ndcap`` is
    ours to remove; one that cannot be removed stays, as it is harmless.
    """
    removed = []
    try:
        candidates = sorted(directory.glob(f"*{fmt.FAULT_SUFFIX}"))
    except OSError:
        return removed
    for path in candidates:
        try:
            st = path.lstat()
            if (not stat.S_ISREG(st.st_mode) or st.st_size != 0
                    or not path.with_suffix(fmt.CAPTURE_SUFFIX).is_file()):
                continue
            path.unlink()
        except OSError:
            continue
        removed.append(path)
    return removed
