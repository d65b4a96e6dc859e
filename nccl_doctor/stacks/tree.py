"""The stack classes of a hang as a call-prefix tree (STAT's view): frames shared by many ranks
once, with how many ranks went through them, the branches where ranks part ways below."""

from __future__ import annotations

from typing import Sequence

from nccl_doctor.page_model import Node
from nccl_doctor.sections import StackClass


def prefix_tree(classes: Sequence[StackClass]) -> tuple[Node, ...]:
    """``stack_classes`` (frames root first) as a tree."""
    paths = [(c.frames, c.ranks, c.odd) for c in classes]
    return _build(paths, 0)


def _build(paths: list[tuple[tuple[str, ...], tuple[int, ...], bool]],
           depth: int) -> tuple[Node, ...]:
    by_frame: dict[str, list[tuple[tuple[str, ...], tuple[int, ...], bool]]] = {}
    for path in paths:
        if len(path[0]) > depth:
            by_frame.setdefault(path[0][depth], []).append(path)
    nodes = []
    for frame, below in by_frame.items():
        ranks = tuple(sorted(r for _, rs, _ in below for r in rs))
        nodes.append(Node(frame, ranks, all(odd for _, _, odd in below), _build(below, depth + 1)))
    return tuple(sorted(nodes, key=lambda n: (-len(n.ranks), n.frame)))
