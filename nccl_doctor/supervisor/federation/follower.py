"""A follower's part of the link: every ``every`` seconds a beat (its ranks' progress counters,
notes counters, ranks whose process is gone, whether its job ended: O(its ranks) bytes) and, once
its ranks have been still for ``quiet_for`` seconds (or ended, or wrote notes), its ranks in
brief (capture/summary.py: bounded whatever the captures hold). In a job of more than
``FULL_NODES`` nodes a quiet node sends its ranks' digest instead (a few hundred bytes a rank:
each group's last call, its end, its lateness window), and its summary only when the leader asks
(the nodes its digests make suspect) or its job ended. It reads the leader's decisions and
answers its requests (stacks, Flight Recorder pulls, a fresh summary or digest) from its own
host; its ranks that ran unrecorded go with its summary, with why."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Callable

from nccl_doctor.supervisor.federation import store as st
from nccl_doctor.supervisor.federation.transport import LinkState, Role, Transport


#: How often a follower whose ranks keep moving publishes their summary (bounded: TAIL calls a
#: rank), for the leader's straggler watch, which looks every 10 s...
SUMMARY_EVERY = 10.0
#: ... and at scale, no more than this many nodes' summaries a second in all (1,024 nodes: one
#: each 102 s, 330 KB/s into the leader; its look then takes seconds, and the straggler watch
#: looks no more often than 20 times a look's cost anyway).
NODES_PER_S = 10.0
#: The most decisions of the leader a follower reads in one look (the watches make a few a run).
DECISIONS = 16
#: Up to this many nodes, a quiet node sends its full summary at once (the leader reads them all:
#: 30 KB a node); beyond, its digest (federation/leader.py asks the suspects for summaries).
FULL_NODES = 16


@dataclass(frozen=True)
class Local:
    """What this node's supervisor hands the link every tick."""

    counts: dict[int, int]
    notes: dict[int, int]
    down: tuple[int, ...]  # ranks whose process is gone
    ended: bool
    node_rank: int | None


class Follower:
    """A node whose ranks the leader diagnoses; it serves the leader from its own host."""

    role = Role.FOLLOWER

    def __init__(self, transport: Transport, *,
                 answer: Callable[[str, list[int], float], dict[str, Any]],
                 summaries: Callable[..., dict[str, Any]]) -> None:
        """``answer(what, ranks, timeout)`` serves a leader's request from this host;
        ``summaries(ended, lean=False)`` reads this node's ranks in brief (``lean``: in
        digest): ``{"ranks": [summary, ...], "unrecorded": {"rank": {"why": ..., "host":
        ...}}}``."""
        self.t = transport
        self.answer, self.summaries = answer, summaries
        self._last_beat = -1e9
        self._beat_n = 0
        self._summary_key: tuple | None = None
        self._summary_v = 0
        self._summary_at = -1e9
        self._digest_key: tuple | None = None
        self._digest_v = 0
        self._digest_at = -1e9
        self._moved_at = transport.clock()
        self._last_counts: dict[int, int] = {}
        self._decisions_seen = 0
        self._requests_done = 0
        self._ended = False  # this node's job ended: its summaries are final
        self._roster: dict[str, Any] = {}  # rank -> [host, node rank]: the leader's last word

    def start(self) -> None:
        self.t.reach_store(lambda: self._beat({}, {}, (), False, None))

    def close(self) -> None:
        self.t.close()

    def follow(self, local: Local) -> list[dict[str, Any]]:
        """A follower's look: publish, then the leader's new decisions (in order)."""
        now = self.t.clock()
        if local.counts != self._last_counts:
            self._last_counts, self._moved_at = dict(local.counts), now
        if self.t.state is LinkState.CONNECTING:
            if self.t.take_pending():
                self.t.announce(f"joined the job's nodes at {self.t.rdzv.address} (leader: "
                              f"{self.t.leader_host or '?'}); " + (
                                  "the leader diagnoses the job" if self.t.key is not None else
                                  "unauthenticated: this node judges its own ranks"))
            elif self.t.refused:
                self.t.alone(self.t.error)
                return []
            elif now - self.t.started_at >= self.t.connect_within and not self.t.said_waiting:
                self.t.said_waiting = True
                self.t.problem = (f"cannot reach the coordinator at {self.t.rdzv.address} "
                                f"({self.t.why_not()})")
                self.t.announce(f"{self.t.problem}: diagnosing this node alone until it answers")
                return []
            else:
                return []
        if self.t.state is not LinkState.JOINED or now - self._last_beat < self.t.every:
            return []
        self._last_beat = now
        try:
            self._publish(local, now)
            return self._read_leader()
        except st.StoreError as err:
            self.t.leader_lost(err)
            self.t.announce(f"{self.t.problem}: diagnosing this node alone")
            return []

    def still_for(self) -> float:
        """A follower: seconds since its ranks last recorded a call."""
        return self.t.clock() - self._moved_at

    def leader_ranks(self) -> dict[int, tuple[str, int | None]]:
        """rank -> (host, node rank) of the leader's own ranks, as it last said."""
        out = {}
        for r, (host, node) in self._roster.items():
            if host == self.t.leader_host:
                out[int(r)] = (str(host), node if isinstance(node, int) else None)
        return out

    def _beat(self, counts: dict[int, int], notes: dict[int, int], down: tuple[int, ...],
              ended: bool, node_rank: int | None) -> dict[str, Any]:
        self._beat_n += 1
        return {"n": self._beat_n, "t": time.time(), "host": self.t.host, "node_rank": node_rank,
                "counts": {str(r): c for r, c in counts.items()},
                "notes": {str(r): c for r, c in notes.items()}, "down": list(down),
                "ended": ended, "summary": self._summary_v, "digest": self._digest_v,
                "rejected": self.t.rejected}  # (values this node found forged: the report's)

    def _publish(self, local: Local, now: float) -> None:
        key = (tuple(sorted(local.counts.items())), tuple(sorted(local.notes.items())),
               local.down, local.ended)
        notes_moved = self._summary_key is not None and key[1] != self._summary_key[1]
        # while its ranks move, a summary every SUMMARY_EVERY s: the leader's straggler watch
        # compares their recent calls with the other nodes' (the slow node, named live)
        quiet = now - self._moved_at >= self.t.quiet_for
        lean = self.t.rdzv.nnodes > FULL_NODES
        due = key != self._summary_key and (
            (quiet and not lean) or local.ended
            or (notes_moved and now - self._summary_at >= 2.0)
            or now - self._summary_at >= max(SUMMARY_EVERY, self.t.rdzv.nnodes / NODES_PER_S))
        if due:
            self.publish_summary(key)
        elif lean and key != self._digest_key and key != self._summary_key and (
                quiet or now - self._digest_at >= SUMMARY_EVERY):
            self.publish_digest(key)  # (while its ranks move: the leader's straggler watch
            # names a slow node from the digests' waits, analysis/slow/waits.py)
        st.put(self.t.store, st.beat_key(self.t.id), self._beat(
            local.counts, local.notes, local.down, local.ended, local.node_rank))

    def publish_summary(self, key: tuple | None = None, ended: bool = False) -> None:
        self._summary_v = self._put(st.summary_key, self._summary_v, self.summaries(ended))
        self._summary_key, self._summary_at = key, self.t.clock()

    def publish_digest(self, key: tuple | None = None) -> None:
        """This node's ranks in digest (capture/summary.py ``digest``), for the leader's look at
        a quiet job of many nodes."""
        brief = self.summaries(False, lean=True)
        self._digest_v = self._put(st.digest_key, self._digest_v, brief)
        self._digest_key, self._digest_at = key, self.t.clock()

    def _put(self, key_of: Callable[[str], str], version: int, brief: dict[str, Any]) -> int:
        """``brief`` (this node's ranks, summarised or digested) as the next version under
        ``key_of`` this node; that version."""
        version += 1
        st.put(self.t.store, key_of(self.t.id), {
            "v": version, "ranks": brief.get("ranks", []),
            "unrecorded": brief.get("unrecorded", {}),
            "counts": {str(r): c for r, c in self._last_counts.items()}})
        return version

    def _read_leader(self) -> list[dict[str, Any]]:
        n, req, roster = st.get_many(self.t.store, [st.DECISION_N, st.request_key(self.t.id),
                                                   st.ROSTER])
        if isinstance(roster, dict):
            self._roster = roster
        out = []
        if isinstance(n, int) and n > self._decisions_seen:
            # at most DECISIONS a look, those written: without a key the count may be forged
            # (and a read of a name never written would wait out the store's timeout)
            n = min(n, self._decisions_seen + DECISIONS)
            names = [st.decision_key(k) for k in range(self._decisions_seen + 1, n + 1)]
            if not st.has_all(self.t.store, names):
                names = [k for k in names if st.has(self.t.store, k)]
            out = [d for d in st.get_many(self.t.store, names) if isinstance(d, dict)]
            self._decisions_seen = n
        if isinstance(req, dict) and isinstance(req.get("n"), int) and req["n"] > self._requests_done:
            self._requests_done = req["n"]
            what = str(req.get("what"))
            ranks = [int(r) for r in req.get("ranks", [])]
            if what == "summary":
                self.publish_summary(None, ended=self._ended)
                reply: dict[str, Any] = {"v": self._summary_v}
            elif what == "digest":
                self.publish_digest(None)
                reply = {"v": self._digest_v}
            else:
                reply = self.answer(what, ranks, float(req.get("timeout", 5.0)))
            st.put(self.t.store, st.response_key(self.t.id, req["n"]), reply)
        return out

    def follower_finish(self, local: Local, wait: float) -> dict[str, Any] | None:
        """A follower's job ended: publish its end, then wait (up to ``wait`` s, beating) for
        the leader's final report; None if the leader is gone or never answered."""
        # a job that ended before the nodes met: they still meet, for its report - within the
        # join window, which opens once torch.distributed is loaded (minutes, on a host the job
        # keeps busy: waited for as long as ``wait`` allows)
        give_up = self.t.clock() + wait
        while (self.t.state is LinkState.CONNECTING and self.t.pending is None and not self.t.refused
               and self._still_coming(give_up)):
            time.sleep(0.2)
        self.t.take_pending()
        if self.t.state is LinkState.CONNECTING:
            self.t.state = LinkState.ALONE
            self.t.problem = (f"never reached the coordinator at {self.t.rdzv.address} "
                            f"({self.t.why_not()})")
        if self.t.state is not LinkState.JOINED:
            return None
        deadline = self.t.clock() + wait
        try:
            self._last_counts, self._ended = dict(local.counts), True
            self.publish_summary(None, ended=True)
            while self.t.clock() < deadline:
                st.put(self.t.store, st.beat_key(self.t.id), self._beat(
                    local.counts, local.notes, local.down, True, local.node_rank))
                self._read_leader()  # answer requests while the leader finishes
                final = st.get(self.t.store, st.FINAL) if st.has(self.t.store, st.FINAL) else None
                if final is not None:  # (one that failed authentication reads None: wait on)
                    st.add(self.t.store, st.FINAL_ACKS, 1)
                    return final if self._covers(final, local) else None
                time.sleep(min(self.t.every, 0.2))
        except st.StoreError as err:
            self.t.leader_lost(err)
            self.t.announce(f"{self.t.problem}: this node's report covers it alone")
        return None

    def say_ended(self, local: Local) -> None:
        """This node's job ended: its last beat says so (no final report is awaited: a node
        without a key diagnoses its own ranks)."""
        if self.t.state is not LinkState.JOINED:
            return
        try:
            st.put(self.t.store, st.beat_key(self.t.id), self._beat(
                local.counts, local.notes, local.down, True, local.node_rank))
        except st.StoreError:
            pass  # the leader's store is gone: nothing more to say to it

    def _still_coming(self, give_up: float) -> bool:
        loaded, now = self.t.loaded_at, self.t.clock()
        if loaded is None:
            return now < give_up
        return now < loaded + self.t.connect_within

    def _covers(self, final: Any, local: Local) -> bool:
        """The leader's final report sees this node's ranks (one made before this node joined
        does not: this node's own report says more, and why)."""
        if not isinstance(final, dict):
            return False
        seen = {r.get("rank") for r in final.get("ranks", []) if isinstance(r, dict)
                and r.get("state") != "no_capture"}
        if all(rank in seen for rank in local.counts):
            return True
        self.t.problem = ("the leader's report was made before this node joined and does not "
                        "see its ranks")
        self.t.announce(f"{self.t.problem}: this node's report covers it alone")
        return False
