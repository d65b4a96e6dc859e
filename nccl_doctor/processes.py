"""A process named for good: its pid *and* its start time (a pid alone may be reused)."""

from __future__ import annotations


def started(pid: int) -> float | None:
    """The start time psutil gives a live process (None: gone, a zombie, or not ours to see)."""
    try:
        import psutil  # (the reaper imports this module: nothing heavy at import time)

        p = psutil.Process(pid)
        if p.status() == psutil.STATUS_ZOMBIE:
            return None
        return p.create_time()
    except Exception:
        return None
