"""This node's link to the job's other nodes (nccl_doctor/supervisor/federation/store.py holds
the keys).

A **follower** publishes, every ``every`` seconds, a beat (its ranks' progress counters, notes
counters, ranks whose process is gone, whether its job ended: O(its ranks) bytes) and, once its
ranks have been still for ``quiet_for`` seconds (or ended, or wrote notes), its ranks in brief
(capture/summary.py: bounded whatever the captures hold). It reads the leader's decisions and
answers its requests (stacks, Flight Recorder pulls, a fresh summary) from its own host. Its
ranks that ran unrecorded (capture/unrecorded.py) go with its summary, with why.

The **leader** hosts the store, reads every beat once per look and the summaries only when its
watches read the traces (while the job is quiet). A follower whose beat stops for ``lost_after``
seconds is lost: its ranks' ends become ``lost`` (the ``node_lost`` finding).

Every store failure is one line to the user and a node working alone, never an exception into
the supervision.
"""

from __future__ import annotations

import enum
import os
import threading
import time
from dataclasses import dataclass, field, replace
from typing import Any, Callable

from nccl_doctor.capture import summary
from nccl_doctor.capture.unrecorded import MAX_WORLD, kept
from nccl_doctor.model import ExitKind, Integrity, RankExit, RankMeta, RankTrace, Unrecorded
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


@dataclass(eq=False)  # one per follower: compared by identity
class Remote:
    """A follower as the leader knows it."""

    id: str
    host: str = ""
    node_rank: int | None = None
    beat: dict[str, Any] = field(default_factory=dict)
    seen_at: float = 0.0  # the leader's clock when the beat last changed
    moved_at: float = 0.0  # the leader's clock when its ranks' counters last moved
    traces: dict[int, RankTrace] = field(default_factory=dict)  # from its latest summary
    unrecorded: dict[int, Unrecorded] = field(default_factory=dict)  # from the same summary
    version: int = 0  # the summary the traces come from
    summary_counts: dict[str, Any] = field(default_factory=dict)  # the counters it shows
    lost: bool = False
    lost_at_wall: float = 0.0

    @property
    def ranks(self) -> list[int]:
        """Its ranks that record (those of its beat)."""
        return [int(r) for r in self.beat.get("counts", {})]

    @property
    def name(self) -> str:
        return f"{self.host} (node {self.node_rank})" if self.node_rank is not None else self.host


def _unrecorded(raw: Any, traces: dict[int, RankTrace]) -> dict[int, Unrecorded]:
    """A summary's unrecorded ranks, believed only as far as they make sense (a rank number in
    range, without a capture of its own, a reason in text, cut to a bounded length)."""
    out: dict[int, Unrecorded] = {}
    if not isinstance(raw, dict):
        return out
    for key, entry in raw.items():
        rank = int(key) if isinstance(key, str) and key.isascii() and key.isdigit() else -1
        why = entry.get("why") if isinstance(entry, dict) else None
        host = entry.get("host") if isinstance(entry, dict) else None
        if 0 <= rank < MAX_WORLD and rank not in traces and isinstance(why, str):
            out[rank] = kept(why, host if isinstance(host, str) else "")
    return out


def lost_rank(rank: int, host: str, node_rank: int | None, when_ns: int | None,
              world_size: int = 0) -> RankTrace:
    """A rank lost with its host, of which nothing but its host is known."""
    return RankTrace(
        meta=RankMeta(rank=rank, world_size=world_size, local_rank=None, node_rank=node_rank, host=host,
                      pid=0, started_ns=0),
        events=(), exit=RankExit(ExitKind.LOST, exception=host, time_ns=when_ns),
        integrity=Integrity(), path="")


@dataclass(frozen=True)
class Local:
    """What this node's supervisor hands the link every tick."""

    counts: dict[int, int]
    notes: dict[int, int]
    down: tuple[int, ...]  # ranks whose process is gone
    ended: bool
    node_rank: int | None


class Link:
    def __init__(self, rdzv: Rendezvous, host: str, *, announce: Callable[[str], None],
                 answer: Callable[[str, list[int], float], dict[str, Any]],
                 summaries: Callable[[bool], dict[str, Any]],
                 clock: Callable[[], float] = time.monotonic, timeout: float = 2.0,
                 every: float = 0.5, quiet_for: float = 0.5, lost_after: float = 6.0,
                 connect_within: float = 30.0) -> None:
        """``answer(what, ranks, timeout)`` serves a leader's request from this host;
        ``summaries(ended)`` reads this node's ranks in brief: ``{"ranks": [summary, ...],
        "unrecorded": {"rank": {"why": ..., "host": ...}}}``."""
        self.rdzv, self.host = rdzv, host
        self.id = f"{host}-{os.getpid()}"
        self.announce, self.answer, self.summaries = announce, answer, summaries
        self.clock, self.timeout, self.every = clock, timeout, every
        self.quiet_for, self.lost_after, self.connect_within = quiet_for, lost_after, connect_within
        self.role = Role.FOLLOWER
        self.state = LinkState.CONNECTING
        self.leader_host = ""
        self.problem = ""  # why this node is alone, for the report
        self._store: Any = None
        self._pending: Any = None  # a store the connecting thread reached
        self._error = ""
        self._refused = False  # what listens there is not this job's coordinator: stop trying
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()
        self._started = clock()
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
        self.remotes: dict[str, Remote] = {}
        self._registered = 0
        self._decision_n = 0
        self._request_n = 0
        self._roster: dict[str, Any] = {}  # rank -> [host, node rank]: the leader's last word
        self.lost_at_wall = 0.0  # a follower: when the leader was lost

    # -- starting ------------------------------------------------------------------------------
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
            store = st.open_store(self.rdzv.host, self.rdzv.port, leader=True,
                                  timeout=self.timeout)
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

    def wait_started(self, timeout: float) -> None:
        """Until the leader's store is up or failed (a benchmark, a test)."""
        if self._thread is not None:
            self._thread.join(timeout)
        self.gather()

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
        while not self._stop.is_set():
            try:
                store = st.open_store(self.rdzv.host, self.rdzv.port, leader=False,
                                      timeout=self.timeout)
                for _ in range(10):  # the leader writes the magic right after it listens
                    if st.has(store, st.MAGIC):
                        break
                    time.sleep(0.2)
                magic = st.get(store, st.MAGIC) if st.has(store, st.MAGIC) else None
                if (not isinstance(magic, dict) or magic.get("format") != st.FORMAT
                        or magic.get("job") != self.rdzv.job):
                    self._error = (f"{self.rdzv.address} is not this job's nccl-doctor "
                                   "coordinator")
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

    def _alone(self, why: str) -> None:
        self.state = LinkState.ALONE
        self.problem = why
        self.announce(f"{why}: diagnosing this node alone")

    def close(self) -> None:
        self._stop.set()

    # -- every tick ----------------------------------------------------------------------------
    def follow(self, local: Local) -> list[dict[str, Any]]:
        """A follower's look: publish, then the leader's new decisions (in order)."""
        now = self.clock()
        if local.counts != self._last_counts:
            self._last_counts, self._moved_at = dict(local.counts), now
        if self.state is LinkState.CONNECTING:
            if self._take_pending():
                self.announce(f"joined the job's nodes at {self.rdzv.address} (leader: "
                              f"{self.leader_host or '?'}); the leader diagnoses the job")
            elif self._refused:
                self._alone(self._error)
                return []
            elif now - self._started >= self.connect_within and not self._said_waiting:
                self._said_waiting = True
                self.problem = (f"cannot reach the coordinator at {self.rdzv.address} "
                                f"({self._error or 'no answer'})")
                self.announce(f"{self.problem}: diagnosing this node alone until it answers")
                return []
            else:
                return []
        if self.state is not LinkState.JOINED or now - self._last_beat < self.every:
            return []
        self._last_beat = now
        try:
            self._publish(local, now)
            return self._read_leader()
        except st.StoreError as err:
            self._leader_lost(err)
            self.announce(f"{self.problem}: diagnosing this node alone")
            return []

    def still_for(self) -> float:
        """A follower: seconds since its ranks last recorded a call."""
        return self.clock() - self._moved_at

    def _leader_lost(self, err: Exception) -> None:
        self.state, self.lost_at_wall = LinkState.LEADER_LOST, time.time()
        self.problem = f"the leader ({self.leader_host or self.rdzv.host}) was lost ({err})"

    def leader_ranks(self) -> dict[int, tuple[str, int | None]]:
        """rank -> (host, node rank) of the leader's own ranks, as it last said."""
        out = {}
        for r, (host, node) in self._roster.items():
            if host == self.leader_host:
                out[int(r)] = (str(host), node if isinstance(node, int) else None)
        return out

    def publish_roster(self, local: dict[int, tuple[str, int | None]]) -> None:
        """The leader's word on which host runs each rank (when it changed)."""
        roster = {str(r): list(v) for r, v in local.items()}
        for remote in self.remotes.values():
            for r in remote.ranks:
                roster.setdefault(str(r), [remote.host, remote.node_rank])
        if roster != self._roster and self.state is LinkState.JOINED:
            self._roster = roster
            try:
                st.put(self._store, st.ROSTER, roster)
            except st.StoreError:
                pass

    def _beat(self, counts: dict[int, int], notes: dict[int, int], down: tuple[int, ...],
              ended: bool, node_rank: int | None) -> dict[str, Any]:
        self._beat_n += 1
        return {"n": self._beat_n, "t": time.time(), "host": self.host, "node_rank": node_rank,
                "counts": {str(r): c for r, c in counts.items()},
                "notes": {str(r): c for r, c in notes.items()}, "down": list(down),
                "ended": ended, "summary": self._summary_v}

    def _publish(self, local: Local, now: float) -> None:
        key = (tuple(sorted(local.counts.items())), tuple(sorted(local.notes.items())),
               local.down, local.ended)
        notes_moved = self._summary_key is not None and key[1] != self._summary_key[1]
        due = key != self._summary_key and (
            now - self._moved_at >= self.quiet_for or local.ended
            or (notes_moved and now - self._summary_at >= 2.0))
        if due:
            self.publish_summary(key)
        st.put(self._store, st.beat_key(self.id), self._beat(
            local.counts, local.notes, local.down, local.ended, local.node_rank))

    def publish_summary(self, key: tuple | None = None, ended: bool = False) -> None:
        brief = self.summaries(ended)
        self._summary_v += 1
        self._summary_key, self._summary_at = key, self.clock()
        st.put(self._store, st.summary_key(self.id), {
            "v": self._summary_v, "ranks": brief.get("ranks", []),
            "unrecorded": brief.get("unrecorded", {}),
            "counts": {str(r): c for r, c in self._last_counts.items()}})

    def _read_leader(self) -> list[dict[str, Any]]:
        n, req, roster = st.get_many(self._store, [st.DECISION_N, st.request_key(self.id),
                                                   st.ROSTER])
        if isinstance(roster, dict):
            self._roster = roster
        out = []
        if isinstance(n, int) and n > self._decisions_seen:
            out = [d for d in st.get_many(
                self._store, [st.decision_key(k) for k in range(self._decisions_seen + 1, n + 1)])
                if isinstance(d, dict)]
            self._decisions_seen = n
        if isinstance(req, dict) and isinstance(req.get("n"), int) and req["n"] > self._requests_done:
            self._requests_done = req["n"]
            what = str(req.get("what"))
            ranks = [int(r) for r in req.get("ranks", [])]
            if what == "summary":
                self.publish_summary(None, ended=self._ended)
                reply: dict[str, Any] = {"v": self._summary_v}
            else:
                reply = self.answer(what, ranks, float(req.get("timeout", 5.0)))
            st.put(self._store, st.response_key(self.id, req["n"]), reply)
        return out

    # -- the leader ----------------------------------------------------------------------------
    def gather(self) -> None:
        """The leader's look: every follower's beat (new followers join here)."""
        if self.role is not Role.LEADER or not self._hosted():
            return
        now = self.clock()
        try:
            registered = st.add(self._store, st.NODES, 0)
            if registered > self._registered:
                ids = st.get_many(self._store, [st.node_key(i) for i in
                                                range(self._registered + 1, registered + 1)])
                for node in ids:
                    if isinstance(node, str) and node not in self.remotes:
                        self.remotes[node] = Remote(node, seen_at=now)
                self._registered = registered
            remotes = list(self.remotes.values())
            beats = st.get_many(self._store, [st.beat_key(r.id) for r in remotes])
        except st.StoreError as err:  # the leader's own store: nothing to be done but say so
            self._alone(f"the coordinator's store failed ({err})")
            return
        for remote, beat in zip(remotes, beats):
            if not isinstance(beat, dict):
                continue
            if beat.get("n") != remote.beat.get("n"):
                if beat.get("counts") != remote.beat.get("counts"):
                    remote.moved_at = now
                remote.beat, remote.seen_at = beat, now
                remote.host = str(beat.get("host", remote.host))
                if isinstance(beat.get("node_rank"), int):
                    remote.node_rank = beat["node_rank"]
                if remote.lost:
                    remote.lost = False
                    self.announce(f"{remote.name} answers again")
            elif (not remote.lost and not beat.get("ended")
                  and now - remote.seen_at >= self.lost_after):
                remote.lost, remote.lost_at_wall = True, float(beat.get("t", time.time()))
                self.announce(f"LOST: {remote.name} stopped answering for "
                              f"{now - remote.seen_at:.0f} s (ranks "
                              f"{', '.join(map(str, sorted(remote.ranks)))})")

    def remote_counts(self) -> tuple[dict[int, int], dict[int, int]]:
        """(rank -> calls recorded, rank -> notes bytes) of every follower's ranks."""
        counts: dict[int, int] = {}
        notes: dict[int, int] = {}
        for remote in self.remotes.values():
            counts.update({int(r): int(c) for r, c in remote.beat.get("counts", {}).items()})
            notes.update({int(r): int(c) for r, c in remote.beat.get("notes", {}).items()})
            if remote.lost:  # a lost node's ranks count as moved once: the watchdog looks again
                for r in remote.ranks:
                    counts[r] = counts.get(r, 0) + 1_000_000_000
        return counts, notes

    def remote_traces(self, fresh: bool = True) -> list[RankTrace]:
        """Every follower's ranks from its latest summary; with ``fresh``, nodes whose summary
        is older than their beat are asked for a new one first. A lost node's running ranks
        read as lost with it."""
        if self.role is not Role.LEADER or self.state is not LinkState.JOINED:
            return []
        want = [r for r in self.remotes.values()
                if int(r.beat.get("summary", 0) or 0) > r.version]
        # a node still recording calls is not asked: its summary would be old at once (and a
        # silent-error look while the job runs must not make every node read its captures)
        now = self.clock()
        wanted = {r.id for r in want}
        stale = [r for r in self.remotes.values()
                 if not r.lost and r.id not in wanted and r.beat.get("counts") != r.summary_counts
                 and now - r.moved_at >= self.quiet_for and self._answers(r, now)]
        try:
            if fresh and stale:
                replies = self._request(stale, "summary", self.timeout)
                want += [r for r, reply in zip(stale, replies) if isinstance(reply, dict)]
            docs = st.get_many(self._store, [st.summary_key(r.id) for r in want])
        except st.StoreError:
            docs, want = [], []
        for remote, doc in zip(want, docs):
            if not isinstance(doc, dict) or not isinstance(doc.get("v"), int):
                continue
            traces = {}
            for raw in doc.get("ranks", []):
                try:
                    t = summary.unsummarize(raw)
                except ValueError:
                    continue
                traces[t.rank] = t
            remote.traces, remote.version = traces, doc["v"]
            remote.unrecorded = _unrecorded(doc.get("unrecorded"), traces)
            remote.summary_counts = doc.get("counts") or {}
        out = []
        for remote in self.remotes.values():
            host, when = remote.host or remote.id, int(remote.lost_at_wall * 1e9) or None
            for trace in remote.traces.values():
                if remote.lost and trace.exit.kind is ExitKind.RUNNING:
                    trace = replace(trace, exit=RankExit(ExitKind.LOST, exception=host,
                                                         time_ns=when))
                out.append(trace)
            if remote.lost:  # ranks it never summarised (it was never still): lost all the same
                out += [lost_rank(r, host, remote.node_rank, when)
                        for r in sorted(remote.ranks) if r not in remote.traces]
        return out

    def remote_unrecorded(self) -> dict[int, Unrecorded]:
        """The followers' ranks that ran unrecorded, from their latest summaries."""
        return {r: u for remote in self.remotes.values() for r, u in remote.unrecorded.items()}

    def _answers(self, remote: Remote, now: float) -> bool:
        """Worth asking: not lost, and beating (a node silent for a few beats may be being
        lost: a request would only wait out its timeout)."""
        return not remote.lost and now - remote.seen_at < 4 * self.every

    def fading(self) -> list[Remote]:
        """Followers silent for a few beats, not yet lost: what their ranks last said may be
        stale (a node being killed), so nothing is concluded from it until they beat again or
        are called lost."""
        now = self.clock()
        return [r for r in self.remotes.values() if not r.lost and not self._answers(r, now)]

    def owners(self) -> dict[int, Remote]:
        """rank -> the follower that runs it."""
        return {r: remote for remote in self.remotes.values() for r in remote.ranks}

    def request(self, what: str, ranks: list[int], timeout: float) -> dict[str, Any]:
        """Ask the followers running ``ranks`` for ``what`` (``stacks``, ``procs``,
        ``flight_recorder``); their answers merged (rank -> answer as JSON)."""
        owners = self.owners()
        by_node: dict[str, list[int]] = {}
        now = self.clock()
        for r in ranks:  # a node silent for a few beats is not asked (it may be being lost)
            if r in owners and self._answers(owners[r], now):
                by_node.setdefault(owners[r].id, []).append(r)
        nodes = [self.remotes[n] for n in by_node]
        if not nodes:
            return {}
        replies = self._request(nodes, what, timeout, by_node)
        out: dict[str, Any] = {}
        for reply in replies:
            if isinstance(reply, dict):
                out.update(reply.get("ranks", {}))
        return out

    def _request(self, nodes: list[Remote], what: str, timeout: float,
                 by_node: dict[str, list[int]] | None = None) -> list[Any]:
        """Ask each of ``nodes`` for ``what`` (about its ranks in ``by_node``); their replies
        in order (None: no answer in time)."""
        if self.state is not LinkState.JOINED:
            return []
        sent = []
        try:
            for node in nodes:
                self._request_n += 1
                st.put(self._store, st.request_key(node.id), {
                    "n": self._request_n, "what": what, "timeout": timeout,
                    "ranks": (by_node or {}).get(node.id, [])})
                sent.append((node, self._request_n))
            deadline = time.monotonic() + timeout + self.every + 1.0
            replies = []
            for node, n in sent:
                left = max(0.05, deadline - time.monotonic())
                key = st.response_key(node.id, n)
                if st.wait(self._store, key, left):
                    replies.append(st.get(self._store, key))
                    st.delete(self._store, key)  # the store holds the latest state, no history
                else:
                    replies.append(None)
            return replies
        except st.StoreError:
            return []

    def publish(self, decision: dict[str, Any]) -> None:
        """Hand every follower a decision of the leader's watches."""
        if self.role is not Role.LEADER or self.state is not LinkState.JOINED:
            return
        try:
            self._decision_n += 1
            st.put(self._store, st.decision_key(self._decision_n), decision)
            st.put(self._store, st.DECISION_N, self._decision_n)
        except st.StoreError:
            pass  # the leader's own store; gather() says so on the next look

    # -- the end -------------------------------------------------------------------------------
    def all_ended(self) -> bool:
        """The leader: every follower expected has joined, and ended or was lost - or the ones
        missing had ``connect_within`` seconds to join and did not."""
        if self.role is not Role.LEADER:
            return True
        if self.state is LinkState.CONNECTING:  # its store is still coming up
            return self.clock() - self._started >= self.connect_within
        if self.state is not LinkState.JOINED:
            return True
        joined = len(self.remotes) + 1 >= self.rdzv.nnodes
        if not joined and self.clock() - self._started < self.connect_within:
            return False
        return all(r.lost or r.beat.get("ended") for r in self.remotes.values())

    def publish_final(self, report: dict[str, Any], wait: float) -> None:
        """The final report for every node; waits (up to ``wait`` s) until the followers that
        are still there read it, so the store outlives their last read."""
        if self.role is not Role.LEADER or self.state is not LinkState.JOINED:
            return
        try:
            st.put(self._store, st.FINAL, report)
            alive = sum(1 for r in self.remotes.values() if not r.lost)
            deadline = self.clock() + wait
            while st.add(self._store, st.FINAL_ACKS, 0) < alive and self.clock() < deadline:
                time.sleep(0.1)
        except st.StoreError:
            pass

    def follower_finish(self, local: Local, wait: float) -> dict[str, Any] | None:
        """A follower's job ended: publish its end, then wait (up to ``wait`` s, beating) for
        the leader's final report; None if the leader is gone or never answered."""
        # a job that ended before the nodes met: they still meet, for its report
        while (self.state is LinkState.CONNECTING and self._pending is None and not self._refused
               and self.clock() - self._started < self.connect_within):
            time.sleep(0.2)
        self._take_pending()
        if self.role is Role.FOLLOWER and self.state is LinkState.CONNECTING:
            self.state = LinkState.ALONE
            self.problem = self.problem or (f"never reached the coordinator at "
                                            f"{self.rdzv.address} ({self._error or 'no answer'})")
        if self.role is not Role.FOLLOWER or self.state is not LinkState.JOINED:
            return None
        deadline = self.clock() + wait
        try:
            self._last_counts, self._ended = dict(local.counts), True
            self.publish_summary(None, ended=True)
            while self.clock() < deadline:
                st.put(self._store, st.beat_key(self.id), self._beat(
                    local.counts, local.notes, local.down, True, local.node_rank))
                self._read_leader()  # answer requests while the leader finishes
                if st.has(self._store, st.FINAL):
                    final = st.get(self._store, st.FINAL)
                    st.add(self._store, st.FINAL_ACKS, 1)
                    return final if isinstance(final, dict) else None
                time.sleep(min(self.every, 0.2))
        except st.StoreError as err:
            self._leader_lost(err)
            self.announce(f"{self.problem}: this node's report covers it alone")
        return None
