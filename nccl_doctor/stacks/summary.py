"""What a rank's stack says, in a line: where its main thread is in the user's code (pure)."""

from __future__ import annotations

from typing import Any

from nccl_doctor import paths
from nccl_doctor.stacks.aggregate import classify
from nccl_doctor.stacks.rank_stack import RankStack


def _library(path: str) -> bool:
    return paths.is_wrapper_file(path) or paths.is_internal_file(path)


def _own(path: str) -> bool:
    """The user's code: neither a library we know nor the standard library."""
    return not _library(path) and not paths.is_stdlib_file(path)


def user_frame(stack: RankStack) -> str | None:
    """'path:line in function' of the innermost frame of the main thread in the user's code."""
    main = stack.main
    if main is None:
        return None
    for user in (_own, lambda p: not _library(p), lambda p: True):  # innermost first, each pass
        f = next((f for f in main.frames if user(f.path)), None)
        if f is not None:
            return f.text("in")
    return None


def user_frames(stack: RankStack, limit: int = 3) -> tuple[str, ...]:
    """The main thread's frames in the user's code, innermost first (at most ``limit``); else
    the one ``user_frame`` finds."""
    main = stack.main
    if main is None:
        return ()
    own = [f.text("in") for f in main.frames if _own(f.path)][:limit]
    if own:
        return tuple(own)
    one = user_frame(stack)
    return (one,) if one else ()


def stack_summary(stack: RankStack) -> str:
    if stack.error and not stack.threads:
        return f"no stack ({stack.error})"
    return f"{user_frame(stack) or '?'} [{stack.source}]"


def stack_classes(stacks: dict[int, RankStack]) -> list[dict[str, Any]]:
    """STAT-style classes of the main threads' stacks, for the report (root-first frames)."""
    out = []
    for c in classify(stacks):
        out.append({
            "ranks": list(c.ranks), "odd": c.odd,
            "frames": [f.text("frame") for f in c.frames],
            "sources": sorted({stacks[r].source for r in c.ranks if r in stacks}),
        })
    return out
