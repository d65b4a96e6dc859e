"""Where a rank's training steps start, on its own clock (pure): read from the calls at its most
repeated call site. A step ends at each long pause between one call's return and the next call -
at least half the longest - so several calls a step from one line (DDP's buckets, a layer's
all_reduce) still make one step. Pauses, not enter times: a rank that waits long inside a step's
first call (for a late peer) enters its second long after the first.

One reading for the straggler's cost per step (analysis/slow/lateness.py) and a rank's own work per
step (analysis/slow/busy.py)."""

from __future__ import annotations

from collections import Counter

from nccl_doctor.analysis.calls.wording import call_site
from nccl_doctor.model import Event


def at_site(events: list[Event]) -> list[Event]:
    """The calls at the most repeated call site (every call when none repeats), in time
    order."""
    if not events:
        return []
    site, count = Counter(call_site(e) for e in events).most_common(1)[0]
    return sorted((e for e in events if count < 2 or call_site(e) == site),
                  key=lambda e: e.t_enter_ns)


def step_starts(calls: list[Event]) -> list[int]:
    """When each step started (enter times) among ``calls``, one site's calls in time order
    (``at_site``)."""
    if not calls:
        return []
    pauses = [b.t_enter_ns - (a.t_exit_ns or a.t_enter_ns) for a, b in zip(calls, calls[1:])]
    longest = max(pauses, default=0)
    return [calls[0].t_enter_ns] + [b.t_enter_ns for p, b in zip(pauses, calls[1:])
                                    if longest > 0 and p >= longest / 2]
