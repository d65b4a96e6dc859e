"""Evidence the watches gather from live ranks: stacks (py-spy, else the in-rank agent) and
Flight Recorder dumps (through the agent). What the stacks say is nccl_doctor.stacks.summary's."""

from __future__ import annotations

import time
from typing import Any

from nccl_doctor.supervisor.agent_client import AgentUnavailable, request_many
from nccl_doctor.supervisor import pyspy
from nccl_doctor.stacks.rank_stack import RankStack, parse_stack_json


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


def flight_recorder_dumps(pids: dict[int, int], run_id: str, *, timeout: float,
                          stacks: bool = False) -> dict[int, dict[str, Any]]:
    """Each live rank's Flight Recorder dump, through its agent (ranks that cannot answer, or
    whose Flight Recorder is off, are left out); ``stacks``: with each newest entry's Python
    stack (rank/agent_commands.py: only of a job being confirmed as hung)."""
    if not pids:
        return {}
    out = {}
    fields = {"stacks": True} if stacks else {}
    for rank, reply in request_many(run_id, pids, "flight_recorder", timeout=timeout,
                                    **fields).items():
        if not isinstance(reply, AgentUnavailable) and reply.get("ok"):
            trace = reply.get("trace")
            if isinstance(trace, dict):
                out[rank] = trace
    return out
