"""A loop the sides of a desync ran a different number of times, and the calls each rank made in
its last pass: what blame.py says when no branch on the rank split the ranks.

The loops are read from each side's frames (source/branch.py ``loops``): one that some side is
in and another is not is a loop some ranks left sooner. The ranks' calls inside it, counted on
each rank's last unbroken pass through it, say by how many calls each fell short. A loop inside
a library the user's line called (ZeRO-3's generate decoding until each rank's own end) shows as
a different number of calls from that line.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Iterable

from nccl_doctor import paths
from nccl_doctor.source.branch import Loop, loops
from nccl_doctor.source.source_text import Sources
from nccl_doctor.analysis.calls.wording import ranks_text, site
from nccl_doctor.location import Location
from nccl_doctor.model import Event, EventKind, TraceSet
from nccl_doctor.redact import source_line

__all__ = ["Side", "loop_line"]


@dataclass(frozen=True)
class Side:
    """One side of a desync (blame.py): ranks in one place. Defined here, where the loops are
    counted, so that blame.py imports this module and not the other way round."""
    ranks: tuple[int, ...]
    frames: tuple[Location, ...]  # what is read for its branches, innermost first
    your_line: Location | None  # its innermost frame of the user's


#: how a loop's line in a finding's detail says it (analysis/what/hang.py leaves the line out for a
#: rank that is stuck, not behind)
DIFFERENT_COUNTS = "a different number of times"


def loop_line(sides: list[Side], traces: TraceSet, sources: Sources,
              ) -> tuple[str, dict[str, Any]] | None:
    """A loop the sides ran a different number of times, with the calls each rank made inside
    it: a loop of the user's that one side is still in and another left; else the calls each
    rank made from a side's line of the user's (a loop in the library it calls: ZeRO-3's
    generate decoding until each rank's own end); else such a loop of a library's."""
    seen: dict[tuple[str, int], tuple[Loop, set[int]]] = {}
    for i, side in enumerate(sides):
        for loop in loops(side.frames, sources):
            seen.setdefault((loop.path, loop.line), (loop, set()))[1].add(i)
    ranks = [r for side in sides for r in side.ranks]
    left = [loop for loop, inside in seen.values() if len(inside) < len(sides)]
    mine = [loop for loop in left if paths.is_user_file(loop.path)]
    theirs = [loop for loop in left if paths.is_library_file(loop.path)]
    for found in (*(_counted(loop, traces, ranks) for loop in mine),
                  _from_user_lines(sides, traces, ranks),
                  *(_counted(loop, traces, ranks) for loop in theirs)):
        if found is not None:
            return found
    return None


def _counted(loop: Loop, traces: TraceSet, ranks: list[int],
             ) -> tuple[str, dict[str, Any]] | None:
    counts = {r: calls_inside(traces, r, loop) for r in ranks}
    said = _fewer(counts)
    if said is None:
        return None
    text = (f"The ranks ran the loop at {paths.short_path(loop.path)}:{loop.line} "
            f"(`{source_line(loop.text)}`) {DIFFERENT_COUNTS}: {said} inside it. "
            "The fault may lie on either side: every rank must run it as often as the others.")
    return text, {"path": loop.path, "line": loop.line, "text": source_line(loop.text),
                  "fewer_calls": _deficits(counts)}


def _deficits(counts: dict[int, int]) -> dict[str, int]:
    """How many calls fewer than the most each rank made (what a capture cut to a window of
    the desync tells as well as the whole: the calls before it are the same on every rank)."""
    most = max(counts.values())
    return {str(r): most - n for r, n in sorted(counts.items())}


def _fewer(counts: dict[int, int]) -> str | None:
    """"rank 3 made 1 call fewer than ranks 0-2, 4-7" (None: they made as many)."""
    if len(set(counts.values())) < 2:
        return None
    most = max(counts.values())
    ahead = sorted(r for r, n in counts.items() if n == most)
    behind: dict[int, list[int]] = {}
    for r, n in sorted(counts.items()):
        if n < most:
            behind.setdefault(most - n, []).append(r)
    parts = []
    for gap, rs in sorted(behind.items()):
        verb = "made" if len(rs) == 1 else "each made"
        parts.append(f"{ranks_text(rs)} {verb} {gap} call{'s' if gap != 1 else ''} fewer")
    return "; ".join(parts) + f" than {ranks_text(ahead)}"


def _from_user_lines(sides: list[Side], traces: TraceSet, ranks: list[int],
                     ) -> tuple[str, dict[str, Any]] | None:
    for side in sides:
        line = side.your_line
        if line is None:
            continue
        counts = {r: _last_run(traces, r, lambda e: e.callsite == line)
                  for r in ranks if r in traces.ranks}
        # (every rank called from it: a line one side never reached is the desync itself)
        said = _fewer(counts) if counts and min(counts.values()) > 0 else None
        if said is not None:
            text = (f"The ranks made a different number of calls from {paths.owner(line.path)} "
                    f"{site(line)}: "
                    f"{said} - a loop in what it calls ran {DIFFERENT_COUNTS} per "
                    "rank. The fault may lie on either side: every rank must run it as often "
                    "as the others.")
            return text, {"path": line.path, "line": line.line, "text": "",
                          "fewer_calls": _deficits(counts)}
    return None


def calls_inside(traces: TraceSet, rank: int, loop: Loop,
                 counted: Callable[[Event], bool] | None = None) -> int:
    """``rank``'s calls in its latest pass through ``loop`` (``counted``: only those)."""
    return _last_run(traces, rank, lambda e: _inside(e.frames, loop), counted)


def _last_run(traces: TraceSet, rank: int, inside: Callable[[Event], bool],
              counted: Callable[[Event], bool] | None = None) -> int:
    """The calls of ``rank``'s last unbroken run of calls that are ``inside`` (a loop, a line):
    its latest pass through it (``counted``: only those of the run it holds). Every rank enters
    it in step, so the runs differ by what each did there; counting only this pass keeps the
    count the same in a capture cut to a window of the desync as in the whole."""
    trace = traces.ranks.get(rank)
    if trace is None:
        return 0
    n, entered = 0, False
    for e in reversed(trace.events):
        if e.kind not in (EventKind.COLLECTIVE, EventKind.P2P):
            continue
        if inside(e):
            entered = True
            n += counted is None or counted(e)
        elif entered:
            break
    return n


def _inside(frames: Iterable[Location], loop: Loop) -> bool:
    return any(loc.path == loop.path and loop.first_line <= loc.line <= loop.last_line
               for loc in frames)
