"""This node's link to the job's other nodes: one object with the follower's part
(follower.py), the leader's part (leader.py) and the transport they share (transport.py); the
store's keys are in store.py."""

from __future__ import annotations

from nccl_doctor.supervisor.federation.follower import Follower, Local
from nccl_doctor.supervisor.federation.leader import Leader, Remote, unseen_rank
from nccl_doctor.supervisor.federation.transport import LinkState, Role

__all__ = ["Link", "LinkState", "Local", "Remote", "Role", "unseen_rank"]


class Link(Follower, Leader):
    """A node's link: a follower's until ``start(leader=True)`` makes it the leader's."""
