"""What report.html draws beyond the diagnosis - the collective timeline, the call-prefix tree of
the stacks, the GPU series, the straggler's skew, the ranks' versions - as plain data, computed
by nccl_doctor/analysis/page_builder.py and laid out by the HTML reporter."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Mapping

from nccl_doctor import words
from nccl_doctor.gpu.readings import GpuTrace


@dataclass(frozen=True)
class Cell:
    op: str
    shape: str  # the input tensor's description, e.g. "float32[2,7,96]"
    state: str  # returned | entered | failed | issued
    callsite: str
    odd: bool  # differs from the majority of the ranks that made a call at this number


@dataclass(frozen=True)
class Row:
    ranks: tuple[int, ...]  # one rank, or the ranks whose rows are identical
    cells: tuple[Cell | None, ...]  # per column; None: the rank made no call at that number
    odd: bool  # a cell differs from the majority, or the rank is short of calls its peers made
    culprit: bool  # a rank the root cause names


@dataclass(frozen=True)
class Lane:
    group: str
    seqs: tuple[int, ...]  # the columns' sequence numbers, ascending
    rows: tuple[Row, ...]
    divergence: int | None  # the root cause's sequence number, when it is in this group
    earlier: int  # sequence numbers before the window (not drawn)
    folded: bool  # identical rows were folded


@dataclass(frozen=True)
class Timeline:
    lanes: tuple[Lane, ...]
    world_size: int


@dataclass(frozen=True)
class Node:
    frame: str  # "path:line function"
    ranks: tuple[int, ...]  # the ranks whose main stack goes through this frame (here)
    odd: bool  # only ranks of an odd stack class (not the largest) go through it
    children: tuple[Node, ...]


@dataclass(frozen=True)
class Page:
    """Everything the page draws beyond the diagnosis (each optional)."""

    timeline: Timeline | None = None
    tree: tuple[Node, ...] = ()  # the diagnosis's stack classes as a call-prefix tree
    gpu: GpuTrace | None = None
    # (when, arrival skew in ms, the last rank) of every compared collective, drawn when a
    # straggler was found
    skews: tuple[tuple[float, float, int], ...] = ()
    versions: Mapping[str, str] = field(default_factory=dict)  # the ranks' torch, python, ...


def rank_ranges(ranks: tuple[int, ...]) -> str:
    """``0-3,5,8-9``: ranks as ranges (a folded row's label)."""
    return words.ranges(ranks, ",")
