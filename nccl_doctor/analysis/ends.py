"""How a rank without an exit record ended, judged from what it finished (pure).

Python's atexit, where the recorder writes a rank's exit record, does not run for every rank
that ends well: Ray ends its workers without it, a script may leave by os._exit, a launcher may
SIGKILL what is left after success. Such a rank reads "vanished" at first; it is ``FINISHED``
when its work is known to be done: it destroyed its default process group (the recorder notes
that), or its last collective completed, no peer went on to a collective it never entered, and
the job exited 0.
"""

from __future__ import annotations

from dataclasses import replace

from nccl_doctor.analysis.align import blocked_event, timelines
from nccl_doctor.model import ExitKind, RankExit, RankTrace, TraceSet


def behind_peers(traces: TraceSet) -> dict[int, list[tuple[str, int]]]:
    """rank -> the (group, sequence number) of each collective its peers entered after its
    last one in that group: what the rank would have been needed for."""
    needed: dict[int, list[tuple[str, int]]] = {}
    for name, timeline in timelines(traces).items():
        top = max(timeline.last_seq.values(), default=0)
        for rank, last in timeline.last_seq.items():
            if last < top:
                needed.setdefault(rank, []).append((name, last + 1))
    return needed


def judged(traces: TraceSet) -> TraceSet:
    """``traces`` with each vanished rank whose work had finished marked ``FINISHED``."""
    vanished = [r for r, t in traces.ranks.items() if t.exit.kind is ExitKind.VANISHED]
    if not vanished:
        return traces
    needed = behind_peers(traces)
    ranks = dict(traces.ranks)
    for rank in vanished:
        trace = ranks[rank]
        if _destroyed(trace) or (traces.exit_status == 0 and rank not in needed
                                 and blocked_event(trace) is None):
            ranks[rank] = replace(trace, exit=RankExit(ExitKind.FINISHED,
                                                       time_ns=trace.exit.time_ns))
    return replace(traces, ranks=ranks)


def _destroyed(trace: RankTrace) -> bool:
    return any(n.get("note") == "destroyed" for n in trace.notes)
