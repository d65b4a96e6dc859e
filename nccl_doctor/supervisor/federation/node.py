"""This supervisor's part in a multi-node job: where it meets the others, its link, what it
serves the leader from its own host (stacks, process states, Flight Recorder pulls, its ranks in
brief) and what report.json says of the nodes."""

from __future__ import annotations

import ipaddress
import socket
import time
from dataclasses import replace
from typing import Any, Callable

from nccl_doctor import env
from nccl_doctor.capture import summary
from nccl_doctor.diagnosis import Diagnosis
from nccl_doctor.errors import DoctorError
from nccl_doctor.sections import Nodes, NodeState
from nccl_doctor.supervisor.federation.keys import DEFAULT_KEY, KeyKind
from nccl_doctor.supervisor.federation.link import (Follower, Leader, Link, LinkState, Local,
                                                    Remote, new_link)
from nccl_doctor.supervisor.federation.rendezvous import Rendezvous
from nccl_doctor.supervisor.watching import Decision, LiveJob, Report
from nccl_doctor.watch_log import HangCalled, event_from_json

#: Flight Recorder entries a follower sends per rank (the newest).
FR_ENTRIES = 512


def _is_local(host: str) -> bool:
    """Whether ``host`` names this machine (so that its supervisor hosts the coordinator)."""
    try:
        addr = socket.gethostbyname(host)
        if ipaddress.ip_address(addr).is_loopback:
            return True
        with socket.socket() as s:
            s.bind((addr, 0))
        return True
    except OSError:
        return False


def _unasked(what: str, ranks: list[int], timeout: float) -> dict[str, Any]:
    return {"ranks": {}}


def _unshown(ended: bool, lean: bool = False) -> dict[str, Any]:
    return {"ranks": [], "unrecorded": {}}


class Federation:
    """This supervisor's part in a multi-node job."""

    def __init__(self, rdzv: Rendezvous, live: LiveJob, host: str, *,
                 announce: Callable[[str], None], **link_options: Any) -> None:
        """The node leads when its node rank is 0, or (none given) when the coordinator's host
        is this machine; it follows otherwise. ``link_options``: the transport's (its ``key``:
        None, the nodes meet unauthenticated - each judges its own ranks, see ``trusted``)."""
        self.live, self.host, self.announce = live, host, announce
        rank = rdzv.node_rank
        leads = rank == 0 if rank is not None else _is_local(rdzv.host)
        trusted = link_options.get("key") is not None
        # without a key, a follower serves nobody: what it would write (its ranks in brief,
        # stacks) is read by no node that believes it, and by anyone who reaches the port
        self.link: Link = new_link(rdzv, host, leader=leads, announce=announce,
                                   answer=self._answer if trusted else _unasked,
                                   summaries=self._summaries if trusted else _unshown,
                                   clock=live.clock, **link_options)
        self.transport = self.link.t
        self.ignored = 0  # decisions of the leader not applied (no key)
        self.ignored_stops = 0  # ... of them, those that would have stopped this node's ranks

    @property
    def leader(self) -> Leader | None:
        """This node's leader part (None: it follows)."""
        return self.link if isinstance(self.link, Leader) else None

    @property
    def follower(self) -> Follower | None:
        """This node's follower part (None: it leads)."""
        return self.link if isinstance(self.link, Follower) else None

    @property
    def rdzv(self) -> Rendezvous:
        """Where the nodes meet, as the transport holds it (a Ray run's leader learns its node
        count as the node doctors start: Leader.expect)."""
        return self.transport.rdzv

    def start(self) -> None:
        """The leader hosts the coordinator's store, a follower reaches it (in the
        background)."""
        self.link.start()

    def close(self) -> None:
        self.link.close()

    @property
    def state(self) -> LinkState:
        return self.transport.state

    @property
    def leading(self) -> bool:
        return self.leader is not None and self.state is LinkState.JOINED

    @property
    def trusted(self) -> bool:
        """What comes over the store is authenticated (the nodes have the job's key). Without
        a key anyone who reaches the port can write there, so nothing read there stops a job or
        becomes evidence: each node's watches and report judge its own ranks, and the nodes
        meet only so that the leader's report lists them."""
        return self.transport.key is not None

    @property
    def pooled(self) -> bool:
        """The other nodes' ranks are part of this node's evidence: it leads, with a key."""
        return self.leading and self.trusted

    @property
    def following(self) -> bool:
        """The leader diagnoses this node's ranks (or is being reached): this node's own watches
        wait, and the leader's decisions apply here. Never without a key."""
        return self.follower is not None and self.trusted and (
            self.state is LinkState.JOINED
            or (self.state is LinkState.CONNECTING and not self.transport.problem))

    @property
    def beating(self) -> bool:
        """This node tells the leader of its ranks' progress: it follows, or, without a key,
        it meets the leader for the report's list of nodes only."""
        return self.following or (self.follower is not None and not self.trusted
                                  and self.state in (LinkState.CONNECTING, LinkState.JOINED))

    @property
    def unpooled(self) -> str:
        """Why this node's evidence is its own ranks' only (the report's ``partial``)."""
        if not self.trusted and self.state is not LinkState.ALONE:
            return ("the nodes met unauthenticated, so the other hosts' ranks were not taken "
                    "from the coordinator's store")
        return self.problem or "this node diagnosed alone"

    @property
    def remotes(self) -> dict[str, Remote]:
        """The other nodes as the leader knows them ({}: this node follows)."""
        return self.leader.remotes if self.leader is not None else {}

    @property
    def problem(self) -> str:
        """Why this node is alone ("": it is not)."""
        return self.transport.problem

    def still_for(self) -> float:
        """A follower: how long its ranks have recorded nothing (0 for the leader)."""
        return self.follower.still_for() if self.follower is not None else 0.0

    def follow(self, counts: dict[int, int]) -> list[dict[str, Any]]:
        """A follower's look: its ranks' progress to the leader, the leader's new decisions
        back (in order; without a key, none: they are counted, never applied)."""
        if self.follower is None:
            return []
        decisions = self.follower.follow(self.local(counts, ended=False))
        if self.trusted or not decisions:
            return decisions
        # unauthenticated: anyone could have written them - counted, said once, never applied
        stops = sum(1 for d in decisions if d.get("stop_job"))
        if not self.ignored:
            self.announce("a decision came over the unauthenticated coordinator's store: not "
                          "applied (without a key this node's own watches judge its ranks)")
        self.ignored += len(decisions)
        self.ignored_stops += stops
        return []

    def share_decision(self, decision: Decision, report_path: str) -> None:
        """The leader hands a decision of its watches to every other node (the hang's live
        report travels once, beside its event)."""
        if self.leader is None or not self.leading:
            return
        report, record = decision.report, decision.record
        if isinstance(record, HangCalled):
            record = replace(record, report=None)
        self.leader.publish({
            "report": report.to_json() if report is not None else None,
            "kind": decision.kind.value, "announce": list(decision.announce),
            "report_path": report_path,  # what the announcements name
            "stop_job": decision.stop_job,
            # the leader's own stop: every node's ranks that ended after it were stopped for the
            # hang, whichever node's signal or broken connection ended them first
            "stop_at": round(time.time(), 3) if decision.stop_job else None,
            "record": record.to_json() if record is not None else None})

    @staticmethod
    def decision_of(raw: dict[str, Any], report_path: str) -> tuple[Decision, float | None]:
        """A decision the leader shared, as this node applies it (the paths it names are this
        node's), and when the leader began stopping the job (None: it did not)."""
        report = raw.get("report")
        diagnosis = Diagnosis.from_json(report) if isinstance(report, dict) else None
        record = event_from_json(raw.get("record"))
        if isinstance(record, HangCalled):
            record = replace(record, report=diagnosis)
        theirs = str(raw.get("report_path") or "")
        said = tuple(str(m).replace(theirs, report_path) if theirs else str(m)
                     for m in raw.get("announce", []))
        try:
            kind = Report(raw.get("kind", "hang"))
        except ValueError:
            kind = Report.HANG
        stop_at = raw.get("stop_at")
        return (Decision(report=diagnosis, kind=kind, announce=said,
                         stop_job=bool(raw.get("stop_job")), record=record),
                float(stop_at) if isinstance(stop_at, (int, float)) else None)

    def gather(self) -> bool:
        """The leader: the other nodes' news read; whether every node's job has ended (or the
        node is lost)."""
        if self.leader is None:
            return True
        self.leader.gather()
        # (without a key the other nodes' ends change nothing here: not waited for)
        return self.leader.all_ended() or not self.trusted

    def final_from_leader(self, counts: dict[int, int], wait: float) -> Diagnosis | None:
        """A follower whose job ended: the leader's final report (None: none came)."""
        if self.follower is None:
            return None
        if not self.trusted:  # unauthenticated: its report is its own, whatever came
            self.follower.say_ended(self.local(counts, ended=True))
            return None
        final = self.follower.follower_finish(self.local(counts, ended=True), wait)
        return Diagnosis.from_json(final) if final is not None else None

    def publish_final(self, diagnosis: Diagnosis, wait: float) -> None:
        """The leader's final report for every node (waits up to ``wait`` s for them to read
        it)."""
        if self.leader is not None and self.trusted:  # (without a key: no node takes it)
            self.leader.publish_final(diagnosis.to_json(), wait=wait)

    def manifest_entry(self) -> dict[str, Any]:
        """What the manifest says of this node's part (replay orders the nodes by it)."""
        return {"role": self.link.role.value, "state": self.state.value,
                "node_rank": self.rdzv.node_rank, "host": self.host,
                "coordinator": self.rdzv.address}

    def local(self, counts: dict[int, int], ended: bool) -> Local:
        procs = self.live.procs(list(counts))
        down = tuple(sorted(r for r, p in procs.items() if not p.alive))
        node_rank = self.rdzv.node_rank
        return Local(counts, dict(self.live.registry.notes), down, ended, node_rank)

    # -- a follower serves the leader ----------------------------------------------------------
    def _answer(self, what: str, ranks: list[int], timeout: float) -> dict[str, Any]:
        out: dict[str, Any] = {}
        if what == "stacks":
            out = {str(r): s.to_json() for r, s in self.live.stacks(ranks, timeout).items()}
        elif what == "procs":
            out = {str(r): [p.alive, p.status, p.cpu_seconds]
                   for r, p in self.live.procs(ranks).items()}
        elif what == "flight_recorder":
            for r, dump in self.live.flight_recorder(ranks, timeout).items():
                entries = dump.get("entries")
                if isinstance(entries, list) and len(entries) > FR_ENTRIES:
                    dump = {**dump, "entries": entries[-FR_ENTRIES:]}
                out[str(r)] = dump
        return {"ranks": out}

    def _summaries(self, ended: bool, lean: bool = False) -> dict[str, Any]:
        """This node's ranks in brief (``lean``: in digest), and those that ran unrecorded with
        why; once its job ended, as the post mortem reads them (no exit record: vanished;
        stopped for the leader's hang: stopped)."""
        try:
            traces = self.live.final() if ended else self.live.captures.load()
        except DoctorError:
            return {"ranks": [], "unrecorded": {}}
        brief = summary.digest if lean else summary.summarize
        return {"ranks": [brief(t) for _, t in sorted(traces.ranks.items())],
                "unrecorded": {str(r): {"why": u.why, "host": u.host}
                               for r, u in sorted(traces.unrecorded.items())}}

    @property
    def rejected(self) -> int:
        """Values that failed authentication: read by this node, and (the leader) by the
        followers, as their beats say."""
        return self.leader.rejected() if self.leader is not None else self.transport.rejected

    def trust_notes(self) -> tuple[str, ...]:
        """What the report says of who could be heard on the coordinator's store, with which
        key, and what was not believed."""
        t = self.transport
        if t.state is LinkState.ALONE and not self.remotes:
            return ()  # the nodes never met: nothing was exchanged
        if not self.trusted:
            why = f" ({t.source.where})" if t.source.where else ""
            ignored = ""
            if self.ignored:
                n, stops = self.ignored, self.ignored_stops
                ignored = (f"; {n} decision{'s' if n != 1 else ''} of the leader came over it "
                           f"and {'were' if n != 1 else 'was'} not applied"
                           + (f" ({stops} would have stopped this node's ranks)" if stops
                              else ""))
            return (f"the nodes' supervisors met on {self.rdzv.address} unauthenticated{why}: "
                    "any process that reaches that port could write there, so nothing read "
                    "there was believed - no decision, summary or report of another node "
                    "stopped this node's ranks or became evidence; this report judges this "
                    f"node's ranks by their own captures{ignored}. Give every node the same key "
                    f"({env.FEDERATION_KEY} or {env.FEDERATION_KEY_FILE}, or a home directory "
                    f"they share for the default key ~/{DEFAULT_KEY}) to diagnose them as one "
                    "job",)
        # a key the user gave, or one this run made and handed out, goes without saying (the
        # report's nodes.key names it); the default key in the home directory is said: the
        # user never asked for that file
        notes = ([f"what the nodes exchanged on {self.rdzv.address} was authenticated with "
                  f"{t.source.describe()}"] if t.source.kind is KeyKind.DEFAULT else [])
        n = self.rejected
        if n:
            values, were = (f"{n} values", "were") if n != 1 else ("1 value", "was")
            notes.insert(0, f"{values} on the coordinator's store at {self.rdzv.address} "
                            f"failed authentication and {were} ignored: something other than "
                            "this job's doctors wrote there (forged, overwritten or replayed "
                            "from an earlier run), or a node runs with another key")
        return tuple(notes)

    # -- the leader's report -------------------------------------------------------------------
    def nodes_section(self, diagnosis: Diagnosis | None = None) -> Nodes:
        """What the report's ``nodes`` says: who diagnosed, every node and its state."""
        t = self.transport
        nodes = [NodeState(host=self.host, node_rank=self.rdzv.node_rank,
                           ranks=tuple(sorted(self.live.local())), role=self.link.role.value,
                           state="ok")]
        for remote in self.remotes.values():
            state = "lost" if remote.lost else "ended" if remote.beat.get("ended") else "ok"
            nodes.append(NodeState(host=remote.host, node_rank=remote.node_rank,
                                   ranks=tuple(sorted({*remote.ranks, *remote.unrecorded})),
                                   role="follower", state=state))
        expected = self.rdzv.nnodes
        missing = (expected - len(nodes) if expected and len(nodes) < expected
                   and self.leader is not None else 0)
        return Nodes(diagnosed_by_host=self.host, diagnosed_by_node_rank=self.rdzv.node_rank,
                     coordinator=self.rdzv.address, rendezvous=self.rdzv.source,
                     expected=expected, nodes=tuple(nodes), authenticated=t.key is not None,
                     key=t.source.describe() if t.key is not None else "",
                     problem=t.problem or "", rejected=self.rejected, missing=missing)
