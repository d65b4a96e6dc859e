"""The link's transport: how this node's supervisor hosts (the leader) or reaches (a follower)
the coordinator's store, in the background, and what it does when it cannot - one line to the
user and a node working alone, never an exception into the supervision. A node is a ``Leader``
(leader.py) or a ``Follower`` (follower.py), chosen when it starts; each holds its transport."""

from __future__ import annotations

import enum
import json
import os
import secrets
import threading
import time
from typing import Any, Callable

from nccl_doctor import env
from nccl_doctor.supervisor.federation import sealing
from nccl_doctor.supervisor.federation import store as st
from nccl_doctor.supervisor.federation.keys import DEFAULT_KEY, JobKey, KeyKind
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
                 connect_within: float = 30.0, key: bytes | None = None,
                 key_source: JobKey | None = None) -> None:
        """``key``: the job's key, which authenticates every value on the store (None:
        unauthenticated, as torch's own store); ``key_source``: where it came from (for the
        report)."""
        self.rdzv, self.host = rdzv, host
        self.id = f"{host}-{os.getpid()}"
        self.announce = announce
        self.clock, self.timeout, self.every = clock, timeout, every
        self.quiet_for, self.lost_after, self.connect_within = quiet_for, lost_after, connect_within
        self.key = key
        self.source = key_source or JobKey(key, KeyKind.RUN if key is not None else KeyKind.NONE)
        self.public: dict[str, bytes] = {}  # the leader's: the names anyone can guess -> held
        self._watched_at = -1e9
        self.tampered = 0  # the leader's: public names found overwritten (rejected values)
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
            raw = st.open_store(self.rdzv.host, self.rdzv.port, leader=True,
                                timeout=self.timeout)
            about = {"format": st.FORMAT, "version": st.VERSION, "job": self.rdzv.job,
                     "host": self.host, "node_rank": self.rdzv.node_rank}
            if self.key is None:
                store = raw
                st.put(store, st.MAGIC, {**about, "auth": None})
            else:
                store = sealing.Sealed(raw, self.key, secrets.token_hex(16))
            st.put(store, st.DECISION_N, 0)
            st.put(store, st.ROSTER, {})
            st.add(store, st.NODES, 0)
            if self.key is not None:
                # what anyone can read (for a node that comes without the key, and as bait),
                # then the join record: last, so that a follower that finds it finds the rest
                public = {n: b"0" if n in (st.NODES, st.FINAL_ACKS) else b"null"
                          for n in st.PUBLIC}  # (counters: a rogue's add goes through)
                public[st.MAGIC] = json.dumps({
                    **about, "auth": "hmac-sha256",
                    "default_key": self.source.kind is KeyKind.DEFAULT}).encode()
                join = sealing.Sealed(raw, self.key, "")
                name = sealing.join_name(self.rdzv.job)
                record = json.dumps({**about, "nonce": store.nonce}).encode()
                public[join.name(name)] = join.seal(name, record)
                for n, value in public.items():
                    raw.set(n, value)
                self.public = public
            self.pending = store
        except st.StoreError as err:
            why = "the port is in use" if "EADDRINUSE" in str(err) else str(err)
            self.error = (f"cannot host the coordinator on port {self.rdzv.port} ({why}); "
                          "pass --coordinator HOST:PORT with a free port of node 0's host")
        except Exception as err:  # the raw store's own calls: torch's types vary
            self.error = f"cannot host the coordinator on port {self.rdzv.port} ({err})"

    def watch_public(self) -> None:
        """The leader, with a key: the names anyone can guess (and the join record) still hold
        what it wrote. Each found overwritten is counted as a rejected value and written back,
        and so is a look that finds some deleted. At most once every ``every`` seconds, a round
        trip a name (a compare-and-set: never a read that would wait on a name something else
        deletes)."""
        now = self.clock()
        if not self.public or now - self._watched_at < self.every:
            return
        self._watched_at = now
        raw = sealing.raw_store(self.store)
        try:
            if not raw.check(list(self.public)):
                self.tampered += 1  # (written back below)
            for name, mine in self.public.items():
                if bytes(raw.compare_set(name, "", mine)) != mine:  # (absent: set to mine)
                    self.tampered += 1
                    raw.set(name, mine)
        except Exception as err:  # DistNetworkError, RuntimeError: the leader's own store
            text = str(err).strip()
            raise st.StoreError(text.splitlines()[0] if text else type(err).__name__) from None

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
                raw = st.open_store(self.rdzv.host, self.rdzv.port, leader=False,
                                    timeout=self.timeout)
                store = (self._join(raw, first_beat) if self.key is None
                         else self._join_sealed(raw, first_beat))
                if store is not None:
                    self.pending = store
                return
            except st.StoreError as err:
                self.error = str(err)
                self._stop.wait(1.0)

    def _register(self, store: Any, first_beat: Callable[[], dict[str, Any]],
                  entry: Any) -> None:
        """This node counted among the job's: its first beat, an empty request, its entry."""
        st.put(store, st.beat_key(self.id), first_beat())
        st.put(store, st.request_key(self.id), {"n": 0})
        index = st.add(store, st.NODES, 1)
        st.put(store, st.node_key(index), entry)

    def _refuse(self, why: str) -> None:
        self.error, self.refused = why, True

    def _join(self, store: Any, first_beat: Callable[[], dict[str, Any]]) -> Any:
        """Without a key: the leader's announcement read, this node registered (None: refused,
        and why in ``error``)."""
        for _ in range(10):  # the leader writes the magic right after it listens
            if st.has(store, st.MAGIC):
                break
            time.sleep(0.2)
        try:
            magic = st.get(store, st.MAGIC) if st.has(store, st.MAGIC) else None
        except st.StoreError:  # not JSON: a sealed one of an older doctor
            magic = {"auth": "?"}
        if isinstance(magic, dict) and magic.get("auth"):
            self._refuse(f"{self.rdzv.address} authenticates what the nodes exchange and this "
                         f"node has no key: give it the job's {env.FEDERATION_KEY} or "
                         f"{env.FEDERATION_KEY_FILE}" + (
                             f" (or a home directory shared with node 0's, for the default "
                             f"key ~/{DEFAULT_KEY})" if magic.get("default_key") else ""))
            return None
        if (not isinstance(magic, dict) or magic.get("format") != st.FORMAT
                or magic.get("job") != self.rdzv.job):
            self._refuse(f"{self.rdzv.address} is not this job's nccl-doctor coordinator")
            return None
        self.leader_host = str(magic.get("host", ""))
        self._register(store, first_beat, self.id)
        return store

    def _join_sealed(self, raw: Any, first_beat: Callable[[], dict[str, Any]]) -> Any:
        """With a key: the leader's join record found under the key, this node registered under
        its nonce with a fresh challenge, and the nonce believed once the leader answered the
        challenge under it (None: refused, or closed). A record from an earlier run (replayed:
        its leader does not answer) is tried beside the others the name holds meanwhile; the
        ones never proven are counted as rejected."""
        join = sealing.Sealed(raw, self.key or b"", "")
        name = sealing.join_name(self.rdzv.job)
        tried: dict[str, tuple[Any, str, dict[str, Any]]] = {}  # nonce -> store, challenge, record
        started = time.monotonic()
        while not self._stop.is_set():
            record = st.get(join, name) if st.has(join, name) else None
            nonce = record.get("nonce") if isinstance(record, dict) else None
            if (isinstance(nonce, str) and nonce not in tried and len(tried) < 8
                    and record.get("format") == st.FORMAT and record.get("job") == self.rdzv.job):
                store = sealing.Sealed(raw, self.key or b"", nonce)
                challenge = secrets.token_hex(16)
                self._register(store, first_beat, {"id": self.id, "challenge": challenge})
                tried[nonce] = (store, challenge, record)
            # (a leader with a key rewrites its record within a look: one missing for longer
            # is under another key, or there is no such leader)
            if not tried and time.monotonic() - started >= 5.0:
                self._refuse(self._why_no_record(raw))
                return None
            for store, challenge, record in tried.values():
                key = st.welcome_key(self.id)
                welcome = st.get(store, key) if st.has(store, key) else None
                if isinstance(welcome, dict) and welcome.get("challenge") == challenge:
                    # what failed on the way: forged records, and records no leader proved
                    store.rejected += join.rejected + len(tried) - 1 + sum(
                        other.rejected for other, _, _ in tried.values() if other is not store)
                    self.leader_host = str(record.get("host", ""))
                    return store
            self._stop.wait(0.2)
        return None

    def _why_no_record(self, raw: Any) -> str:
        """Why a node with a key finds no join record under it (the leader's announcement,
        which anyone can read, tells a leader without a key from one with another)."""
        try:
            magic = st.get(raw, st.MAGIC) if st.has(raw, st.MAGIC) else None
        except st.StoreError:
            magic = None
        if isinstance(magic, dict) and magic.get("format") == st.FORMAT and not magic.get("auth"):
            return (f"{self.rdzv.address} does not authenticate what the nodes exchange and this "
                    f"node has a key ({self.source.describe()}): give every node the same key")
        why = (f"{self.rdzv.address} is not this job's nccl-doctor coordinator (or its key "
               "differs from this node's)")
        if self.source.kind is KeyKind.DEFAULT and isinstance(magic, dict) and magic.get(
                "default_key"):
            why += (f": node 0's default key is not this node's {self.source.where} - their home "
                    f"directories are not shared; give every node the same {env.FEDERATION_KEY}")
        return why

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
        store = self.store if self.store is not None else self.pending
        return sealing.rejected(store) + self.tampered

    def leader_lost(self, err: Exception) -> None:
        self.state, self.lost_at_wall = LinkState.LEADER_LOST, time.time()
        self.problem = f"the leader ({self.leader_host or self.rdzv.host}) was lost ({err})"
