"""This node's link to the job's other nodes: a ``Leader`` (leader.py) or a ``Follower``
(follower.py), chosen when the node starts, each holding its ``Transport`` (transport.py); the
store's keys are in store.py."""

from __future__ import annotations

from typing import Any, Callable, Union

from nccl_doctor.supervisor.federation.follower import Follower, Local
from nccl_doctor.supervisor.federation.leader import Leader, Remote, unseen_rank
from nccl_doctor.supervisor.federation.rendezvous import Rendezvous
from nccl_doctor.supervisor.federation.transport import LinkState, Role, Transport

__all__ = ["Follower", "Leader", "Link", "LinkState", "Local", "Remote", "Role", "Transport",
           "new_link", "unseen_rank"]

Link = Union[Leader, Follower]


def new_link(rdzv: Rendezvous, host: str, *, leader: bool, announce: Callable[[str], None],
             answer: Callable[[str, list[int], float], dict[str, Any]],
             summaries: Callable[..., dict[str, Any]], **options: Any) -> Link:
    """The leader's part (``leader``) or a follower's, over a new transport (``options``: the
    transport's timings and key)."""
    transport = Transport(rdzv, host, announce=announce, **options)
    if leader:
        return Leader(transport)
    return Follower(transport, answer=answer, summaries=summaries)
