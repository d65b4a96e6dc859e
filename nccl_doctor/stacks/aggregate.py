"""STAT-style equivalence classes of rank stacks: which ranks stand where, and who is odd.

LLNL's Stack Trace Analysis Tool merges the stacks of thousands of tasks into a prefix tree so that
a hang reads as "1023 tasks here, 1 task there". Here the unit is the thread that makes each
rank's collectives (``RankStack.thread``, the main thread unless they run on another): ranks
with identical stacks form one class, the frames every class shares are shown once, and each
class is described by what follows. Pure functions: no I/O.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable, Mapping, Sequence

from nccl_doctor.location import Location
from nccl_doctor.stacks.rank_stack import RankStack

__all__ = ["StackClass", "classify", "common_prefix", "divergence", "format_classes", "rank_list"]


@dataclass(frozen=True)
class StackClass:
    """Ranks whose collectives' threads have the same stack; ``frames`` root first (outermost first).

    ``missing`` marks the class of ranks with no stack at all (sampling failed, or no Python
    frames); its ``frames`` are empty. ``odd`` marks a class smaller than the largest one.
    """

    frames: tuple[Location, ...]
    ranks: tuple[int, ...]
    odd: bool
    missing: bool = False

    @property
    def size(self) -> int:
        return len(self.ranks)


def classify(stacks: Mapping[int, RankStack], *, depth: int | None = None) -> list[StackClass]:
    """Group the ranks of ``stacks`` by their collectives' thread's stack, largest class first.

    Frames compare by (path, function, line), root first; ``depth`` keeps only the first ``depth``
    frames from the root (coarser classes). With two classes or more, every class smaller than the
    largest is ``odd``: 3 ranks against 1 makes the 1 odd; 2 against 2 makes none odd.
    """
    if depth is not None and depth < 1:
        raise ValueError(f"depth must be at least 1, got {depth}")
    groups: dict[tuple[Location, ...], list[int]] = {}
    missing: list[int] = []
    for rank in sorted(stacks):
        thread = stacks[rank].thread
        frames = thread.root_first if thread is not None and stacks[rank].error is None else ()
        if not frames:
            missing.append(rank)
            continue
        groups.setdefault(frames if depth is None else frames[:depth], []).append(rank)
    found = [(frames, tuple(ranks), False) for frames, ranks in groups.items()]
    if missing:
        found.append(((), tuple(missing), True))
    found.sort(key=lambda c: (-len(c[1]), c[1][0]))
    largest = len(found[0][1]) if found else 0
    several = len(found) >= 2
    return [
        StackClass(frames, ranks, several and len(ranks) < largest, is_missing)
        for frames, ranks, is_missing in found
    ]


def common_prefix(classes: Iterable[StackClass]) -> tuple[Location, ...]:
    """The root-first frames every class with a stack shares (classes without one are ignored)."""
    stacks = [c.frames for c in classes if not c.missing]
    if not stacks:
        return ()
    prefix = stacks[0]
    for frames in stacks[1:]:
        n = 0
        for a, b in zip(prefix, frames):
            if a != b:
                break
            n += 1
        prefix = prefix[:n]
    return prefix


def divergence(classes: Sequence[StackClass]) -> list[tuple[StackClass, tuple[Location, ...]]]:
    """Each class with its frames after ``common_prefix(classes)``: what sets it apart."""
    n = len(common_prefix(classes))
    return [(c, c.frames[n:]) for c in classes]


def format_classes(classes: Sequence[StackClass], *, tail: int = 6) -> list[str]:
    """Plain-text lines: the shared stack once (if any), then one line per class.

    Each class line shows at most ``tail`` frames of its distinct part, innermost last, as
    ``ranks 0, 2, 3 (3): ... -> train.py:41 step -> distributed_c10d.py:2501 all_reduce``.
    """
    if tail < 1:
        raise ValueError(f"tail must be at least 1, got {tail}")
    with_stack = [c for c in classes if not c.missing]
    prefix = common_prefix(classes) if len(with_stack) >= 2 else ()
    lines = []
    if prefix:
        lines.append(f"all ranks: {_chain(prefix, tail)}")
    rows = divergence(classes) if prefix else [(c, c.frames) for c in classes]
    for cls, distinct in rows:
        if cls.missing:
            body = "no stack"
        elif distinct:
            body = _chain(distinct, tail, more_before=bool(prefix))
        else:  # this class stops where the shared stack ends: show where that is
            body = f"{_chain(cls.frames[-1:], 1, more_before=True)} (end of the shared stack)"
        mark = "  <- odd one out" if cls.odd else ""
        word = "rank" if cls.size == 1 else "ranks"
        lines.append(f"{word} {rank_list(cls.ranks)} ({cls.size}): {body}{mark}")
    return lines


def rank_list(ranks: Iterable[int]) -> str:
    """``0, 2, 3`` for short runs, ``0-127, 129-255`` for long ones (runs of 3 or more)."""
    ordered = sorted(set(ranks))
    parts: list[str] = []
    i = 0
    while i < len(ordered):
        j = i
        while j + 1 < len(ordered) and ordered[j + 1] == ordered[j] + 1:
            j += 1
        if j - i >= 2:
            parts.append(f"{ordered[i]}-{ordered[j]}")
        else:
            parts.extend(str(r) for r in ordered[i : j + 1])
        i = j + 1
    return ", ".join(parts)


def _chain(frames: Sequence[Location], tail: int, *, more_before: bool = False) -> str:
    shown = frames[-tail:]
    cut = more_before or len(shown) < len(frames)
    text = " -> ".join(f.text("base") for f in shown)
    return f"... -> {text}" if cut else text
