"""The leader's part of the link: it hosts the store, reads every beat once per look and the
summaries only when its watches read the traces (while the job is quiet), asks the followers for
stacks and Flight Recorder pulls, and hands them its decisions and the final report. A follower
whose beat stops for ``lost_after`` seconds is lost (its ranks' ends: analysis/calls/ends.py).

In a job of more than ``FULL_NODES`` nodes a quiet follower sends its ranks' digests, not their
summaries (capture/summary.py): the leader reads every digest, and asks for full summaries only
the nodes of the ranks the digests make suspect (suspects.py), at most ``SUSPECT_NODES`` of them
- at 1,024 nodes a look reads 3 MB, not 31 MB."""

from __future__ import annotations

import time
from collections import Counter
from dataclasses import dataclass, field, replace
from typing import Any

from nccl_doctor.capture import summary
from nccl_doctor.capture.unrecorded import MAX_WORLD, kept
from nccl_doctor.model import ExitKind, Integrity, RankExit, RankMeta, RankTrace, Unrecorded
from nccl_doctor.supervisor.federation import store as st
from nccl_doctor.supervisor.federation.follower import FULL_NODES
from nccl_doctor.supervisor.federation.suspects import odd_ranks
from nccl_doctor.supervisor.federation.transport import LinkState, Role, Transport

#: The most nodes a look asks for their full summaries, on their digests' word.
SUSPECT_NODES = 8


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
    digests: dict[int, RankTrace] = field(default_factory=dict)  # from its latest digest
    digest_version: int = 0
    digest_counts: dict[str, Any] = field(default_factory=dict)  # the counters it shows
    lost: bool = False
    lost_at_wall: float = 0.0

    @property
    def ranks(self) -> list[int]:
        """Its ranks that record (those of its beat)."""
        return [int(r) for r in self.beat.get("counts", {})]

    @property
    def name(self) -> str:
        return f"{self.host} (node {self.node_rank})" if self.node_rank is not None else self.host

    @property
    def summarized(self) -> bool:
        """Its summary shows the counters of its latest beat."""
        return self.beat.get("counts") == self.summary_counts

    @property
    def current(self) -> dict[int, RankTrace]:
        """Its ranks as newest known: the summary where it shows the latest beat's counters
        (or no digest does), else the digest."""
        if self.summarized or not self.digests:
            return self.traces
        if self.beat.get("counts") == self.digest_counts or not self.traces:
            return self.digests
        return self.digests if _calls(self.digest_counts) > _calls(self.summary_counts) \
            else self.traces


def _calls(counts: dict[str, Any]) -> int:
    return sum(c for c in counts.values() if isinstance(c, int))


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


def unseen_rank(rank: int, host: str, node_rank: int | None, world_size: int = 0) -> RankTrace:
    """A rank of which nothing but its host is known (its node was lost before it said more)."""
    return RankTrace(
        meta=RankMeta(rank=rank, world_size=world_size, local_rank=None, node_rank=node_rank, host=host,
                      pid=0, started_ns=0),
        events=(), exit=RankExit(ExitKind.RUNNING), integrity=Integrity(), path="")


def _trust(t: Transport) -> str:
    """How the nodes' exchange is authenticated, as the leader's first line says it."""
    if t.key is None:
        return "unauthenticated: each node judges its own ranks"
    return f"authenticated with {t.source.describe()}"


class Leader:
    """The node that hosts the coordinator's store and diagnoses the job."""

    role = Role.LEADER

    def __init__(self, transport: Transport) -> None:
        self.t = transport
        self.remotes: dict[str, Remote] = {}  # the followers, by id
        self._registered = 0
        self._unread: dict[int, float] = {}  # node ids counted, not read yet -> when counted
        self._decision_n = 0
        self._request_n = 0
        self._coming: set[str] = set()  # hosts whose node doctor runs but has not joined yet
        self._roster: dict[str, Any] = {}  # rank -> [host, node rank]: the leader's last word
        self._join_by = transport.started_at + transport.connect_within  # nodes may join until

    def start(self) -> None:
        self.t.host_store()

    def close(self) -> None:
        self.t.close()

    def _hosted(self) -> bool:
        """Whether its store is up (says so, or why not, once)."""
        t = self.t
        if t.state is LinkState.CONNECTING:
            if t.take_pending():
                t.announce(f"coordinating {t.rdzv.nnodes or 'the'} nodes on "
                           f"{t.rdzv.address} ({t.rdzv.source}; {_trust(t)})")
            elif t.error:
                t.alone(t.error)
        return t.state is LinkState.JOINED

    def wait_started(self, timeout: float) -> None:
        """Until the leader's store is up or failed (a benchmark, a test)."""
        if self.t.thread is not None:
            self.t.thread.join(timeout)
        self.gather()

    def expect(self, nnodes: int) -> None:
        """More nodes are coming than the leader knew (Ray node doctors just started): it waits
        for them to join, ``connect_within`` seconds from now."""
        if nnodes > self.t.rdzv.nnodes:
            self.t.rdzv = replace(self.t.rdzv, nnodes=nnodes)
            self._join_by = self.t.clock() + self.t.connect_within

    def coming(self, host: str) -> None:
        """A node doctor started on ``host`` (Ray's keeper says so): the leader waits for it to
        join while it runs, however long loading torch takes it on a loaded host - not only for
        its join window - until it joins, or ``gone`` says it ended."""
        self._coming.add(host)

    def gone(self, host: str) -> None:
        """The node doctor on ``host`` ended (its report is written, or it failed)."""
        self._coming.discard(host)

    def publish_roster(self, local: dict[int, tuple[str, int | None]]) -> None:
        """The leader's word on which host runs each rank (when it changed)."""
        roster = {str(r): list(v) for r, v in local.items()}
        for remote in self.remotes.values():
            for r in remote.ranks:
                roster.setdefault(str(r), [remote.host, remote.node_rank])
        if roster != self._roster and self.t.state is LinkState.JOINED:
            self._roster = roster
            try:
                st.put(self.t.store, st.ROSTER, roster)
            except st.StoreError:
                pass

    def gather(self) -> None:
        """The leader's look: every follower's beat (new followers join here)."""
        if not self._hosted():
            return
        now = self.t.clock()
        try:
            registered = st.add(self.t.store, st.NODES, 0)
            if registered > self._registered:  # (a forged count: only ids that exist are read,
                # and no more of them looked for than the nodes expected could write)
                room = max(64, 2 * self.t.rdzv.nnodes) - len(self._unread)
                for i in range(self._registered + 1,
                               min(registered, self._registered + max(0, room)) + 1):
                    self._unread[i] = now
                self._registered = registered
            # a follower writes its id right after counting itself: one never written in a
            # minute was counted by something else, and is looked for no more
            self._unread = {i: t for i, t in self._unread.items() if now - t < 60.0}
            if self._unread:
                there = ([*self._unread] if st.has_all(self.t.store, [
                    st.node_key(i) for i in self._unread]) else [
                    i for i in self._unread if st.has(self.t.store, st.node_key(i))])
                if there:
                    for entry in st.get_many(self.t.store, [st.node_key(i) for i in there]):
                        self._register(entry, now)
                    for i in there:
                        del self._unread[i]
            self.t.watch_public()
            remotes = list(self.remotes.values())
            beats = st.get_many(self.t.store, [st.beat_key(r.id) for r in remotes])
        except st.StoreError as err:  # the leader's own store: nothing to be done but say so
            self.t.alone(f"the coordinator's store failed ({err})")
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
                    self.t.announce(f"{remote.name} answers again")
            elif (not remote.lost and not beat.get("ended")
                  and now - remote.seen_at >= self.t.lost_after):
                remote.lost, remote.lost_at_wall = True, float(beat.get("t", time.time()))
                self.t.announce(f"LOST: {remote.name} stopped answering for "
                              f"{now - remote.seen_at:.0f} s (ranks "
                              f"{', '.join(map(str, sorted(remote.ranks)))})")

    def _register(self, entry: Any, now: float) -> None:
        """A follower's entry: its id (without a key), or its id and challenge, which the
        leader answers under the run's nonce - the proof the follower waits for before it
        believes anything of this store (transport.py). A follower that registers again (its
        first try went to a replayed join record) is answered again."""
        node, challenge = (entry.get("id"), entry.get("challenge")) if isinstance(
            entry, dict) else (entry, None)
        if not isinstance(node, str):
            return
        if node not in self.remotes:
            self.remotes[node] = Remote(node, seen_at=now)
        if isinstance(challenge, str) and self.t.key is not None:
            st.put(self.t.store, st.welcome_key(node), {"challenge": challenge[:64]})

    def rejected(self) -> int:
        """Values that failed authentication, as read by the leader and (as their beats say) by
        each follower."""
        theirs = (r.beat.get("rejected") for r in self.remotes.values())
        return self.t.rejected + sum(n for n in theirs if isinstance(n, int) and 0 < n < 2**31)

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
        """Every follower's ranks from its latest summary (or, in a job of many nodes, digest);
        with ``fresh``, quiet nodes that sent neither since their beat are asked for one first,
        and at scale the nodes of the ranks their digests make suspect for their summaries. A
        lost node's running ranks read as lost with it."""
        if self.t.state is not LinkState.JOINED:
            return []
        lean = self.t.rdzv.nnodes > FULL_NODES
        remotes = list(self.remotes.values())
        want = [r for r in remotes if int(r.beat.get("summary", 0) or 0) > r.version]
        want_d = [r for r in remotes if int(r.beat.get("digest", 0) or 0) > r.digest_version]
        # a node still recording calls is not asked: its summary would be old at once (and a
        # silent-error look while the job runs must not make every node read its captures)
        now = self.t.clock()
        wanted = {r.id for r in want + want_d}
        stale = [r for r in remotes
                 if not r.lost and r.id not in wanted and not r.summarized
                 and r.beat.get("counts") != r.digest_counts
                 and now - r.moved_at >= self.t.quiet_for and self._answers(r, now)]
        try:
            if fresh and stale:
                replies = self._request(stale, "digest" if lean else "summary", self.t.timeout)
                (want_d if lean else want).extend(
                    r for r, reply in zip(stale, replies) if isinstance(reply, dict))
            self._read(want, want_d)
            if fresh and lean:
                self._read(self._ask_suspects(now), [])
        except st.StoreError:
            pass
        out = []
        for remote in self.remotes.values():
            ranks = remote.current
            out += ranks.values()
            if remote.lost:  # ranks it never summarised (it was never still): named all the same
                out += [unseen_rank(r, remote.host or remote.id, remote.node_rank)
                        for r in sorted(remote.ranks) if r not in ranks]
        return out

    def _ask_suspects(self, now: float) -> list[Remote]:
        """The nodes (at most ``SUSPECT_NODES``, the most suspect ranks first) whose digests
        show a rank parting from its group, asked for their summaries: those that answered."""
        digested = [r for r in self.remotes.values() if r.current is r.digests]
        owners = {rank: remote for remote in digested for rank in remote.digests}
        odd = odd_ranks(t for remote in digested for t in remote.digests.values())
        by_node = Counter(owners[r].id for r in odd if r in owners)
        ask = [self.remotes[n] for n, _ in by_node.most_common()
               if self._answers(self.remotes[n], now)][:SUSPECT_NODES]
        if not ask:
            return []
        replies = self._request(ask, "summary", self.t.timeout)
        return [r for r, reply in zip(ask, replies) if isinstance(reply, dict)]

    def _read(self, want: list[Remote], want_d: list[Remote]) -> None:
        """Fetch and parse the summaries of ``want`` and the digests of ``want_d`` (one round
        trip)."""
        if not want and not want_d:
            return
        docs = st.get_many(self.t.store, [st.summary_key(r.id) for r in want]
                           + [st.digest_key(r.id) for r in want_d])
        for i, (remote, doc) in enumerate(zip(want + want_d, docs)):
            if not isinstance(doc, dict) or not isinstance(doc.get("v"), int):
                continue
            traces = {}
            for raw in doc.get("ranks", []):
                try:
                    t = summary.unsummarize(raw)
                except ValueError:
                    continue
                traces[t.rank] = t
            if i < len(want):
                remote.traces, remote.version = traces, doc["v"]
                remote.summary_counts = doc.get("counts") or {}
            else:
                remote.digests, remote.digest_version = traces, doc["v"]
                remote.digest_counts = doc.get("counts") or {}
            remote.unrecorded = _unrecorded(doc.get("unrecorded"), traces)

    def lost_ranks(self) -> dict[int, tuple[str, int | None]]:
        """rank -> (its host, when it was lost, ns) for the ranks of lost followers (their
        ends: analysis/calls/ends.py)."""
        out = {}
        for remote in self.remotes.values():
            if remote.lost:
                when = int(remote.lost_at_wall * 1e9) or None
                for r in {*remote.ranks, *remote.traces, *remote.digests}:
                    out[r] = (remote.host or remote.id, when)
        return out

    def remote_unrecorded(self) -> dict[int, Unrecorded]:
        """The followers' ranks that ran unrecorded, from their latest summaries."""
        return {r: u for remote in self.remotes.values() for r, u in remote.unrecorded.items()}

    def _answers(self, remote: Remote, now: float) -> bool:
        """Worth asking: not lost, and beating (a node silent for a few beats may be being
        lost: a request would only wait out its timeout)."""
        return not remote.lost and now - remote.seen_at < 4 * self.t.every

    def fading(self) -> list[Remote]:
        """Followers silent for a few beats, not yet lost: what their ranks last said may be
        stale (a node being killed), so nothing is concluded from it until they beat again or
        are called lost."""
        now = self.t.clock()
        return [r for r in self.remotes.values() if not r.lost and not self._answers(r, now)]

    def owners(self) -> dict[int, Remote]:
        """rank -> the follower that runs it."""
        return {r: remote for remote in self.remotes.values() for r in remote.ranks}

    def request(self, what: str, ranks: list[int], timeout: float) -> dict[str, Any]:
        """Ask the followers running ``ranks`` for ``what`` (``stacks``, ``procs``,
        ``flight_recorder``); their answers merged (rank -> answer as JSON)."""
        owners = self.owners()
        by_node: dict[str, list[int]] = {}
        now = self.t.clock()
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
        if self.t.state is not LinkState.JOINED:
            return []
        sent = []
        try:
            for node in nodes:
                self._request_n += 1
                st.put(self.t.store, st.request_key(node.id), {
                    "n": self._request_n, "what": what, "timeout": timeout,
                    "ranks": (by_node or {}).get(node.id, [])})
                sent.append((node, self._request_n))
            deadline = time.monotonic() + timeout + self.t.every + 1.0
            replies = []
            for node, n in sent:
                left = max(0.05, deadline - time.monotonic())
                key = st.response_key(node.id, n)
                if st.wait(self.t.store, key, left):
                    replies.append(st.get(self.t.store, key))
                    st.delete(self.t.store, key)  # the store holds the latest state, no history
                else:
                    replies.append(None)
            return replies
        except st.StoreError:
            return []

    def publish(self, decision: dict[str, Any]) -> None:
        """Hand every follower a decision of the leader's watches."""
        if self.t.state is not LinkState.JOINED:
            return
        try:
            self._decision_n += 1
            st.put(self.t.store, st.decision_key(self._decision_n), decision)
            st.put(self.t.store, st.DECISION_N, self._decision_n)
        except st.StoreError:
            pass  # the leader's own store; gather() says so on the next look

    def all_ended(self) -> bool:
        """The leader: every follower expected has joined, and ended or was lost - or the ones
        missing had ``connect_within`` seconds to join and did not, and no node doctor said to
        be running (``coming``) is still on its way."""
        if self.t.state is LinkState.CONNECTING:  # its store is still coming up
            return self.t.clock() - self.t.started_at >= self.t.connect_within
        if self.t.state is not LinkState.JOINED:
            return True
        joined = len(self.remotes) + 1 >= self.t.rdzv.nnodes
        hosts = {r.host for r in self.remotes.values()}
        if not joined and (self.t.clock() < self._join_by or self._coming - hosts):
            return False
        return all(r.lost or r.beat.get("ended") for r in self.remotes.values())

    def publish_final(self, report: dict[str, Any], wait: float) -> None:
        """The final report for every node; waits (up to ``wait`` s) until the followers that
        are still there read it, so the store outlives their last read."""
        if self.t.state is not LinkState.JOINED:
            return
        try:
            st.put(self.t.store, st.FINAL, report)
            alive = sum(1 for r in self.remotes.values() if not r.lost)
            deadline = self.t.clock() + wait
            while st.add(self.t.store, st.FINAL_ACKS, 0) < alive and self.t.clock() < deadline:
                time.sleep(0.1)
        except st.StoreError:
            pass
