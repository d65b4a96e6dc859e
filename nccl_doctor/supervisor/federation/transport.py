"""The link's transport: how this node's supervisor hosts (the leader) or reaches (a follower)
the coordinator's store, in the background, and what it does when it cannot - one line to the
user and a node working alone, never an exception into the supervision. The follower's and the
leader's parts of the link (follower.py, leader.py) talk through it."""

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
    """The store and the link's state, shared by its follower's and leader's parts."""

    def __init__(self, rdzv: Rendezvous, host: str, *, announce: Callable[[str], None],
                 answer: Callable[[str, list[int], float], dict[str, Any]],
                 summaries: Callable[[bool], dict[str, Any]],
                 clock: Callable[[], float] = time.monotonic, timeout: float = 2.0,
                 every: float = 0.5, quiet_for: float = 0.5, lost_after: float = 6.0,
                 connect_within: float = 30.0, key: bytes | None = None) -> None:
        """``answer(what, ranks, timeout)`` serves a leader's request from this host;
        ``summaries(ended)`` reads this node's ranks in brief: ``{"ranks": [summary, ...],
        "unrecorded": {"rank": {"why": ..., "host": ...}}}``; ``key``: the job's key, which
        authenticates every value on the store (None: unauthenticated, as torch's own store)."""
        self.rdzv, self.host = rdzv, host
        self.id = f"{host}-{os.getpid()}"
        self.announce, self.answer, self.summaries = announce, answer, summaries
        self.clock, self.timeout, self.every = clock, timeout, every
        self.quiet_for, self.lost_after, self.connect_within = quiet_for, lost_after, connect_within
        self.key = key
        self.role = Role.FOLLOWER
        self.state = LinkState.CONNECTING
        self.leader_host = ""
        self.problem = ""  # why this node is alone, for the report
        self._store: Any = None
        self._pending: Any = None  # a store the connecting thread reached
        self._error = ""
        self._loaded_at: float | None = None  # when the connecting thread had torch loaded
        self._refused = False  # what listens there is not this job's coordinator: stop trying
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()
        self._started = clock()
        self._join_by = self._started + connect_within  # the leader: until then nodes may join
        self._said_waiting = False
        # follower
        self._last_beat = -1e9
        self._beat_n = 0
        self._summary_key: tuple | None = None
        self._summary_v = 0
        self._summary_at = -1e9
        self._moved_at = clock()
        self._last_counts: dict[int, int] = {}
        self._decisions_seen = 0
        self._requests_done = 0
        self._ended = False  # this node's job ended: its summaries are final
        # leader
        self.remotes: dict[str, Any] = {}  # the leader's followers (leader.Remote)
        self._registered = 0
        self._unread: dict[int, float] = {}  # node ids counted, not read yet -> when counted
        self._decision_n = 0
        self._request_n = 0
        self._coming: set[str] = set()  # hosts whose node doctor runs but has not joined yet
        self._roster: dict[str, Any] = {}  # rank -> [host, node rank]: the leader's last word
        self.lost_at_wall = 0.0  # a follower: when the leader was lost

    def start(self, leader: bool) -> None:
        """Host the coordinator (``leader``) or reach it, in the background: loading torch and
        meeting the others never delays the job's start."""
        if leader:
            self.role = Role.LEADER
        self._thread = threading.Thread(target=self._host if leader else self._connect,
                                        name="nccl-doctor-link", daemon=True)
        self._thread.start()

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
            self._pending = store
        except st.StoreError as err:
            why = "the port is in use" if "EADDRINUSE" in str(err) else str(err)
            self._error = (f"cannot host the coordinator on port {self.rdzv.port} ({why}); "
                           "pass --coordinator HOST:PORT with a free port of node 0's host")

    def _take_pending(self) -> bool:
        """The store the background thread hosted or reached, in use from now (False: none)."""
        if self.state is not LinkState.CONNECTING or self._pending is None:
            return False
        self._store, self.state = self._pending, LinkState.JOINED
        return True

    def _hosted(self) -> bool:
        """The leader: whether its store is up (says so, or why not, once)."""
        if self.state is LinkState.CONNECTING:
            if self._take_pending():
                self.announce(f"coordinating {self.rdzv.nnodes or 'the'} nodes on "
                              f"{self.rdzv.address} ({self.rdzv.source})")
            elif self._error:
                self._alone(self._error)
        return self.state is LinkState.JOINED

    def _connect(self) -> None:
        """Reach the leader's store (in a thread: a follower may start first)."""
        try:
            st.load()
        except st.StoreError as err:
            self._error = str(err)
        self._loaded_at = self.clock()
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
                    self._error = (f"{self.rdzv.address} authenticates what the nodes exchange "
                                   f"and this node has no key: give it the job's "
                                   f"{env.FEDERATION_KEY} or {env.FEDERATION_KEY_FILE}")
                    self._refused = True
                    return
                if (not isinstance(magic, dict) or magic.get("format") != st.FORMAT
                        or magic.get("job") != self.rdzv.job):
                    self._error = (f"{self.rdzv.address} is not this job's nccl-doctor "
                                   "coordinator" + (" (or its key differs from this node's)"
                                                    if self.key is not None else ""))
                    self._refused = True
                    return
                self.leader_host = str(magic.get("host", ""))
                st.put(store, st.beat_key(self.id), self._beat({}, {}, (), False, None))
                st.put(store, st.request_key(self.id), {"n": 0})
                index = st.add(store, st.NODES, 1)
                st.put(store, st.node_key(index), self.id)
                self._pending = store
                return
            except st.StoreError as err:
                self._error = str(err)
                self._stop.wait(1.0)

    def _why_not(self) -> str:
        """Why this node has not reached the coordinator yet (its last attempt's error)."""
        if self._error:
            return self._error
        if self._loaded_at is None:
            return "not tried yet: still loading torch.distributed"
        return "no answer"

    def _alone(self, why: str) -> None:
        self.state = LinkState.ALONE
        self.problem = why
        self.announce(f"{why}: diagnosing this node alone")

    def close(self) -> None:
        self._stop.set()

    @property
    def rejected(self) -> int:
        """Values on the store that failed authentication (ignored), read by this node."""
        return st.rejected(self._store if self._store is not None else self._pending)

    def _leader_lost(self, err: Exception) -> None:
        self.state, self.lost_at_wall = LinkState.LEADER_LOST, time.time()
        self.problem = f"the leader ({self.leader_host or self.rdzv.host}) was lost ({err})"
