"""Evidence the watchdog gathers from live ranks: stacks (py-spy, else the in-rank agent)."""

from __future__ import annotations

import time
from typing import Any

from nccl_doctor import paths
from nccl_doctor.supervisor.agent_client import AgentUnavailable, request_many
from nccl_doctor.supervisor import pyspy
from nccl_doctor.stacks.aggregate import classify
from nccl_doctor.stacks.rank_stack import Frame, RankStack, parse_stack_json


def collect_stacks(pids: dict[int, int], run_id: str, *, timeout: float) -> dict[int, RankStack]:
    """Every rank's Python stacks, in parallel: py-spy first; the in-rank agent for the ranks
    py-spy could not read (not installed, or no ptrace permission in a container)."""
    if not pids:
        return {}
    stacks = pyspy.collect(pids, timeout=timeout)
    failed = {r: pids[r] for r, s in stacks.items() if s.error or not s.threads}
    if not failed:
        return stacks
    replies = request_many(run_id, failed, "stacks", timeout=timeout)
    for rank, reply in replies.items():
        if isinstance(reply, AgentUnavailable) or not reply.get("ok"):
            reason = str(reply) if isinstance(reply, AgentUnavailable) else reply.get("error")
            previous = stacks[rank].error or "no stack"
            stacks[rank] = RankStack(rank, failed[rank], stacks[rank].source, (),
                                     error=f"{previous}; agent: {reason}", taken_at=time.time())
            continue
        try:
            stacks[rank] = parse_stack_json(reply.get("threads", []), rank=rank, pid=failed[rank],
                                            source="agent", taken_at=time.time())
        except ValueError as err:
            stacks[rank] = RankStack(rank, failed[rank], "agent", (), error=str(err),
                                     taken_at=time.time())
    return stacks


def _library(path: str) -> bool:
    return paths.is_wrapper_file(path) or paths.is_internal_file(path)


def _own(path: str) -> bool:
    """The user's code: neither a library we know nor the standard library."""
    return not _library(path) and not paths.is_stdlib_file(path)


def _where(f: Frame) -> str:
    return f"{paths.short_path(f.path)}:{f.line} in {f.function}"


def user_frame(stack: RankStack) -> str | None:
    """'path:line in function' of the innermost frame of the main thread in the user's code."""
    main = stack.main
    if main is None:
        return None
    for user in (_own, lambda p: not _library(p), lambda p: True):  # innermost first, each pass
        f = next((f for f in main.frames if user(f.path)), None)
        if f is not None:
            return _where(f)
    return None


def user_frames(stack: RankStack, limit: int = 3) -> tuple[str, ...]:
    """The main thread's frames in the user's code, innermost first (at most ``limit``); else
    the one ``user_frame`` finds."""
    main = stack.main
    if main is None:
        return ()
    own = [_where(f) for f in main.frames if _own(f.path)][:limit]
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
            "frames": [f"{paths.short_path(f.path)}:{f.line} {f.function}" for f in c.frames],
            "sources": sorted({stacks[r].source for r in c.ranks if r in stacks}),
        })
    return out


def flight_recorder_dumps(pids: dict[int, int], run_id: str, *,
                          timeout: float) -> dict[int, dict[str, Any]]:
    """Each live rank's Flight Recorder dump, through its agent (ranks that cannot answer, or
    whose Flight Recorder is off, are left out)."""
    if not pids:
        return {}
    out = {}
    for rank, reply in request_many(run_id, pids, "flight_recorder", timeout=timeout).items():
        if not isinstance(reply, AgentUnavailable) and reply.get("ok"):
            trace = reply.get("trace")
            if isinstance(trace, dict):
                out[rank] = trace
    return out
