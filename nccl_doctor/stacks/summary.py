"""What a rank's stack says, in a line: where the thread that makes its collectives is in the
user's code (``RankStack.thread``: the main thread unless the collectives run on another), with
the main thread beside it when that is another (pure)."""

from __future__ import annotations

import os

from nccl_doctor import paths
from nccl_doctor.location import Location
from nccl_doctor.sections import StackClass
from nccl_doctor.stacks.aggregate import classify
from nccl_doctor.stacks.rank_stack import RankStack, ThreadStack


def _library(path: str) -> bool:
    return paths.is_library_file(path)


def _own(path: str) -> bool:
    """The user's code: not installed (``paths.is_library_file``)."""
    return paths.is_user_file(path)


def own_frame(thread: ThreadStack) -> Location | None:
    """The innermost frame of ``thread`` in the user's code (None: it has none)."""
    return next((f for f in thread.frames if _own(f.path)), None)


def user_frame(stack: RankStack, thread: ThreadStack | None = None) -> str | None:
    """'path:line in function' of the innermost frame in the user's code of ``thread`` (default:
    the thread that makes the rank's collectives)."""
    thread = thread or stack.thread
    if thread is None:
        return None
    f = own_frame(thread) or (thread.frames[0] if thread.frames else None)
    return f.text("in") if f is not None else None


def user_frames(stack: RankStack, limit: int = 3) -> tuple[str, ...]:
    """The collectives' thread's frames in the user's code, innermost first (at most
    ``limit``); else the one ``user_frame`` finds."""
    thread = stack.thread
    if thread is None:
        return ()
    own = [f.text("in") for f in thread.frames if _own(f.path)][:limit]
    if own:
        return tuple(own)
    one = user_frame(stack)
    return (one,) if one else ()


def stack_summary(stack: RankStack) -> str:
    if stack.error and not stack.threads:
        return f"no stack ({stack.error})"
    thread, main = stack.thread, stack.main
    text = f"{user_frame(stack) or '?'} [{stack.source}]"
    if thread is not None and main is not None and thread is not main:
        name = f"thread {thread.name!r}" if thread.name else f"thread {thread.thread_id}"
        text += f" on {name}; main thread at {user_frame(stack, main) or '?'}"
    return text


def stack_classes(stacks: dict[int, RankStack]) -> list[StackClass]:
    """STAT-style classes of the stacks of the threads that make the ranks' collectives, for
    the report (root-first frames)."""
    out = []
    for c in classify(stacks):
        frames = tuple(f.text("frame") for f in c.frames)
        out.append(StackClass(
            ranks=tuple(c.ranks), odd=c.odd, frames=frames, tail=class_tail(list(frames)),
            sources=tuple(sorted({stacks[r].source for r in c.ranks if r in stacks}))))
    return out


def class_tail(frames_: list[str]) -> str:
    """A stack class in one line: the innermost frames of the user's code, then where it sits
    (the innermost frame outside nccl_doctor; what lies between is elided). ``frames_`` are
    root-first "path:line function" strings."""
    def path(f: str) -> str:
        return os.sep + f.split(":", 1)[0]

    user = [i for i, f in enumerate(frames_) if not paths.is_internal_file(path(f))]
    if not user:
        return " -> ".join(frames_[-3:])
    last = user[-1]
    shown = frames_[max(0, last - 1):last + 1]
    inner = [i for i, f in enumerate(frames_)
             if i > last and f"{os.sep}nccl_doctor{os.sep}" not in path(f)]
    if inner:
        shown += (["..."] if inner[-1] > last + 1 else []) + [frames_[inner[-1]]]
    return " -> ".join(shown)
