"""The link's transport: how this node's supervisor hosts (the leader) or reaches (a follower)
the coordinator's store, in the background, and what it does when it cannot - one line to the
user and a node working alone, never an exception into the supervision. A node is a ``Leader``
(leader.py) or a ``Follower`` (follower.py), chosen when it starts; each holds its transport."""

from __future__ import annotations

import enum
import os
import threading
import time
from typing import Any, Callable

from nccl_doctor import env
from nccl_doctor.supervisor.federation import store as st
from nccl_doctor.supervisor.federation.rendezvous import Rendezvous


class Role(str, enum.Enum):
    LEADER = "leader"
    FOLLOWER = "follower"


class LinkState(str, enum.Enum):
    CONNECTING = "connecting"  # a follower trying to reach the coordinator
    JOINED = "joined"  # the nodes meet: the leader diagnoses the job
    ALONE = "alone"  # no coordinator (cannot host or reach it): this node is diagnosed alone
    LEADER_LOST = "leader_lost"  # the leader stopped answering: this node goes on alone


class Transport:
    """The store and the link's state, as the node's leader or follower uses them."""

    def __init__(self, rdzv: Rendezvous, host: str, *, announce: Callable[[str], None],
                 clock: Callable[[], float] = time.monotonic, timeout: float = 2.0,
                 every: float = 0.5, quiet_for: float = 0.5, lost_after: float = 6.0,
                 connect_within: float = 30.0, key: bytes | None = None) -> None:
        """``key``: the job's key, which authenticates every value on the store (None:
        unauthenticated, as torch's own store)."""
        self.rdzv, self.host = rdzv, host
        self.id = f"{host}-{os.getpid()}"
        self.announce = announce
        self.clock, self.timeout, self.every = clock, timeout, every
        self.quiet_for, self.lost_after, self.connect_within = quiet_for, lost_after, connect_within
        self.key = key
        self.state = LinkState.CONNECTING
        self.leader_host = ""
        self.problem = ""  # why this node is alone, for the report
        self.store: Any = None
        self.pending: Any = None  # a store the background thread hosted or reached
        self.error = ""
        self.loaded_at: float | None = None  # when the connecting thread had torch loaded
        self.refused = False  # what listens there is not this job's coordinator: stop trying
        self.thread: threading.Thread | None = None
        self._stop = threading.Event()
        self.started_at = clock()
        self.said_waiting = False
        self.lost_at_wall = 0.0  # a follower: when the leader was lost

    def host_store(self) -> None:
        """Host the coordinator's store, in the background: loading torch never delays the
        job's start."""
        self.thread = threading.Thread(target=self._host, name="nccl-doctor-link", daemon=True)
        self.thread.start()

    def reach_store(self, first_beat: Callable[[], dict[str, Any]]) -> None:
        """Reach the coordinator's store, in the background (a follower may start first);
        ``first_beat``: what this node says of itself on joining."""
        self.thread = threading.Thread(target=self._connect, args=(first_beat,),
                                       name="nccl-doctor-link", daemon=True)
        self.thread.start()

    def _host(self) -> None:
        try:
            store = st.sealed(st.open_store(self.rdzv.host, self.rdzv.port, leader=True,
                                            timeout=self.timeout), self.key)
            st.put(store, st.MAGIC, {
                "format": st.FORMAT, "version": st.VERSION, "job": self.rdzv.job,
                "host": self.host, "node_rank": self.rdzv.node_rank})
            st.put(store, st.DECISION_N, 0)
            st.put(store, st.ROSTER, {})
            st.add(store, st.NODES, 0)
            self.pending = store
        except st.StoreError as err:
            why = "the port is in use" if "EADDRINUSE" in str(err) else str(err)
            self.error = (f"cannot host the coordinator on port {self.rdzv.port} ({why}); "
                          "pass --coordinator HOST:PORT with a free port of node 0's host")

    def take_pending(self) -> bool:
        """The store the background thread hosted or reached, in use from now (False: none)."""
        if self.state is not LinkState.CONNECTING or self.pending is None:
            return False
        self.store, self.state = self.pending, LinkState.JOINED
        return True

    def _connect(self, first_beat: Callable[[], dict[str, Any]]) -> None:
        try:
            st.load()
        except st.StoreError as err:
            self.error = str(err)
        self.loaded_at = self.clock()
        while not self._stop.is_set():
            try:
                store = st.sealed(st.open_store(self.rdzv.host, self.rdzv.port, leader=False,
                                                timeout=self.timeout), self.key)
                for _ in range(10):  # the leader writes the magic right after it listens
                    if st.has(store, st.MAGIC):
                        break
                    time.sleep(0.2)
                try:
                    magic = st.get(store, st.MAGIC) if st.has(store, st.MAGIC) else None
                except st.StoreError:  # not JSON: sealed, and this node has no key
                    if self.key is not None:
                        raise
                    self.error = (f"{self.rdzv.address} authenticates what the nodes exchange "
                                  f"and this node has no key: give it the job's "
                                  f"{env.FEDERATION_KEY} or {env.FEDERATION_KEY_FILE}")
                    self.refused = True
                    return
                if (not isinstance(magic, dict) or magic.get("format") != st.FORMAT
                        or magic.get("job") != self.rdzv.job):
                    self.error = (f"{self.rdzv.address} is not this job's nccl-doctor "
                                  "coordinator" + (" (or its key differs from this node's)"
                                                   if self.key is not None else ""))
                    self.refused = True
                    return
                self.leader_host = str(magic.get("host", ""))
                st.put(store, st.beat_key(self.id), first_beat())
                st.put(store, st.request_key(self.id), {"n": 0})
                index = st.add(store, st.NODES, 1)
                st.put(store, st.node_key(index), self.id)
                self.pending = store
                return
            except st.StoreError as err:
                self.error = str(err)
                self._stop.wait(1.0)

    def why_not(self) -> str:
        """Why this node has not reached the coordinator yet (its last attempt's error)."""
        if self.error:
            return self.error
        if self.loaded_at is None:
            return "not tried yet: still loading torch.distributed"
        return "no answer"

    def alone(self, why: str) -> None:
        self.state = LinkState.ALONE
        self.problem = why
        self.announce(f"{why}: diagnosing this node alone")

    def close(self) -> None:
        self._stop.set()

    @property
    def rejected(self) -> int:
        """Values on the store that failed authentication (ignored), read by this node."""
        return st.rejected(self.store if self.store is not None else self.pending)

    def leader_lost(self, err: Exception) -> None:
        self.state, self.lost_at_wall = LinkState.LEADER_LOST, time.time()
        self.problem = f"the leader ({self.leader_host or self.rdzv.host}) was lost ({err})"
