"""A jump the data decided: what blame.py says when no branch on the rank split the ranks, but
a ``continue``/``break``/``return``/``raise`` under a condition that does not read the rank (a
NaN guard, ``if not torch.isfinite(loss): continue``) kept some ranks from a call the others
made.

The jump is read from a side's frames of the user's (source/branch.py ``data_jumps``): in the
loop that holds the side's call, before it. The ranks that took it are read from the calls:
every rank made as many calls from a line of that loop *before* the jump (the loop ran as often
on every rank), and some made fewer from the side's line *after* it - those skipped it. The
counts are each rank's sequence number of its latest call from the line (torch's per-group
numbers: a capture cut to a window of the desync gives the same as the whole), compared across
the ranks' groups of the same role (the same line on every rank makes the same calls). Without
calls before the jump nothing tells a skipped call from a loop that ran fewer times, and no jump
is named (loop_counts.py then speaks). Library frames are not read for it: a library's own
guards are its business, and following them costs the report.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from nccl_doctor import paths
from nccl_doctor.source.branch import DataJump, data_jumps
from nccl_doctor.analysis.why.loop_counts import Side
from nccl_doctor.source.source_text import Sources
from nccl_doctor.analysis.calls.wording import ranks_text
from nccl_doctor.model import EventKind, TraceSet
from nccl_doctor.redact import source_line

__all__ = ["DataSkip", "data_skip"]


@dataclass(frozen=True)
class DataSkip:
    jump: DataJump
    took: tuple[int, ...]  # the ranks that took it (skipped the call)
    others: tuple[int, ...]
    times: dict[int, int]  # rank -> how many more times than the fewest it skipped
    call_line: int  # the line the jump skipped (the side's call), in the jump's file
    agree_line: int  # a line of the loop before the jump where every rank made as many calls

    @property
    def where(self) -> str:
        return f"{paths.short_path(self.jump.branch.path)}:{self.jump.branch.line}"

    def text(self) -> str:
        b = self.jump.branch
        short = paths.short_path(b.path)
        took, rest = ranks_text(list(self.took)), ranks_text(list(self.others))
        counts = sorted(set(self.times[r] for r in self.took))
        times = " or ".join(str(n) for n in counts)
        plural = "s" if counts != [1] else ""
        return (f"{took} took the `{self.jump.leaves}` at {self.where} "
                f"(`{source_line(b.text)}`) {times} time{plural} more than {rest}, skipping the "
                f"call at {short}:{self.call_line}: the loop at {short}:{self.jump.loop.line} "
                f"ran as often on every rank (the calls at {short}:{self.agree_line}, before the "
                f"jump, agree). The condition at {self.where} differs per rank because of the "
                "data, not the rank number.")

    def hint(self) -> str:
        return (f"`{source_line(self.jump.branch.text)}` at {self.where} is decided by each "
                "rank's own data, and the ranks that take it skip a collective the others make: "
                "every rank must make the same collectives in the same order. Decide it on "
                "every rank alike - reduce the condition across the ranks first (e.g. "
                "`dist.all_reduce(bad, op=dist.ReduceOp.MAX)` on a flag) and skip together - "
                "or make the collective before the jump.")

    def to_json(self) -> dict[str, Any]:
        b = self.jump.branch
        return {"path": b.path, "line": b.line, "text": source_line(b.text),
                "leaves": self.jump.leaves, "ranks": list(self.took),
                "times": {str(r): n for r, n in sorted(self.times.items())},
                "call_line": self.call_line, "agree_line": self.agree_line,
                "loop_line": self.jump.loop.line}


def data_skip(sides: list[Side], traces: TraceSet, sources: Sources) -> DataSkip | None:
    """The data-driven jump that kept some ranks of ``sides`` from the call the others made,
    with the ranks that took it; None when the calls do not show one."""
    ranks = sorted({r for side in sides for r in side.ranks if r in traces.ranks})
    if len(ranks) < 2:
        return None
    for side in sides:
        frames = tuple(f for f in side.frames if paths.is_user_file(f.path))
        if not frames:
            continue
        for jump in data_jumps(frames, sources):
            found = _shown(jump, jump.branch.frame.line, ranks, traces, sources)
            if found is not None:
                return found
    return None


def _shown(jump: DataJump, call_line: int, ranks: list[int], traces: TraceSet,
           sources: Sources | None = None) -> DataSkip | None:
    loop = jump.loop
    last = max(call_line, loop.last_line)
    helpers = _helpers(sources, jump.branch.path, loop.first_line, jump.branch.line) \
        if sources is not None else {}
    latest = _latest(traces, ranks, jump.branch.path, loop.first_line, last, helpers)
    after = latest.get(call_line, {})
    if len(after) < len(ranks) or len(set(after.values())) < 2:
        return None  # a rank never made the call from there, or every rank made as many
    agree = [line for line, seqs in latest.items() if line < jump.branch.line
             and len(seqs) == len(ranks) and len(set(seqs.values())) == 1]
    if not agree:
        return None
    most = max(after.values())
    took = tuple(r for r in ranks if after[r] < most)
    others = tuple(r for r in ranks if after[r] == most)
    return DataSkip(jump, took, others, {r: most - after[r] for r in ranks}, call_line,
                    max(agree))


#: the newest calls of a rank read for the lines of a loop (a window's worth: the loop's last
#: passes are among them)
_READ = 4096


def _latest(traces: TraceSet, ranks: list[int], path: str, first: int, last: int,
            helpers: dict[str, int] | None = None) -> dict[int, dict[int, int]]:
    """line -> rank -> the sequence number (in its group) of the rank's latest collective made
    from that line of ``path`` (lines ``first``..``last``). A call recorded inside a function of
    the user's (its path stops at the user's innermost frame) counts for the loop's line that
    calls that function by name (``helpers``: name -> line), when no frame of it is in the
    loop."""
    out: dict[int, dict[int, int]] = {}
    helpers = helpers or {}
    for r in ranks:
        events = traces.ranks[r].events
        for e in reversed(events[-_READ:]):
            if e.kind is not EventKind.COLLECTIVE or e.align_seq < 0 or e.is_composite:
                continue
            lines = [loc.line for loc in e.frames if loc.path == path and first <= loc.line <= last]
            if not lines and e.callsite is not None and e.callsite.function in helpers:
                lines = [helpers[e.callsite.function]]
            for line in lines:
                out.setdefault(line, {}).setdefault(r, e.align_seq)
    return out


_CALLED = re.compile(r"([A-Za-z_]\w*)\s*\(")


def _helpers(sources: Sources, path: str, first: int, before: int) -> dict[str, int]:
    """name -> the line of ``path`` (``first``..``before - 1``: the loop's lines before the
    jump) that calls a function of that name, the first such line; names called on more than
    one of those lines are left out (which line made the call is not known)."""
    out: dict[str, int] = {}
    twice: set[str] = set()
    lines = sources.lines(path)
    for line in range(first, min(before, len(lines) + 1)):
        for name in set(_CALLED.findall(lines[line - 1].split("#", 1)[0])):
            if name in out:
                twice.add(name)
            out.setdefault(name, line)
    return {n: line for n, line in out.items() if n not in twice}
