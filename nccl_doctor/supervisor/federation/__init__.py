"""Several hosts, one diagnosis: the supervisors of a multi-node job meet (DESIGN.md, "Several
hosts").

One `nccl-doctor run` per node wraps that node's launcher. They find each other from the
launcher's own rendezvous arguments (rendezvous.py) and meet on a torch TCPStore that node 0's
supervisor hosts on its own port (store.py). Followers publish their ranks' progress and, when
quiet, their ranks in brief; the leader's watches run on the union - the same watches and passes
as on one host, through ``FederatedJob`` - and every decision (report, stop) goes to every node
(link.py). A node that cannot meet the others diagnoses its own ranks and says so.
"""

from __future__ import annotations

import ipaddress
from dataclasses import replace
import socket
from typing import Any, Callable, Mapping, Sequence

from nccl_doctor.analysis.situation import ProcState
from nccl_doctor.capture import summary
from nccl_doctor.capture.directory import groups_from_notes, load_capture_dir
from nccl_doctor.capture.union import union
from nccl_doctor.diagnosis import Diagnosis
from nccl_doctor.errors import DoctorError
from nccl_doctor.model import RankTrace, TraceSet
from nccl_doctor.stacks.rank_stack import RankStack, stack_from_json
from nccl_doctor.supervisor.federation.link import Link, LinkState, Local, Role, lost_rank
from nccl_doctor.supervisor.federation.rendezvous import Rendezvous
from nccl_doctor.supervisor.live import LiveJob, Snapshot

#: Flight Recorder entries a follower sends per rank (the newest).
FR_ENTRIES = 512

__all__ = ["Federation", "FederatedJob", "Rendezvous"]


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


class Federation:
    """This supervisor's part in a multi-node job."""

    def __init__(self, rdzv: Rendezvous, live: LiveJob, host: str, *,
                 announce: Callable[[str], None], **link_options: Any) -> None:
        self.rdzv, self.live, self.host = rdzv, live, host
        self.link = Link(rdzv, host, announce=announce, answer=self._answer,
                         summaries=self._summaries, clock=live.clock, **link_options)

    def start(self) -> None:
        rank = self.rdzv.node_rank
        leader = rank == 0 if rank is not None else _is_local(self.rdzv.host)
        self.link.start(leader)

    def close(self) -> None:
        self.link.close()

    @property
    def leading(self) -> bool:
        return self.link.role is Role.LEADER and self.link.state is LinkState.JOINED

    @property
    def following(self) -> bool:
        """The leader diagnoses this node's ranks (or is being reached): this node's own watches
        wait."""
        return self.link.role is Role.FOLLOWER and (
            self.link.state is LinkState.JOINED
            or (self.link.state is LinkState.CONNECTING and not self.link.problem))

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

    def _summaries(self, ended: bool) -> dict[str, Any]:
        """This node's ranks in brief, and those that ran unrecorded with why; once its job
        ended, as the post mortem reads them (no exit record: vanished; stopped for the leader's
        hang: stopped)."""
        try:
            traces = (load_capture_dir(self.live.out_dir, job_ended=True, evidence=True) if ended
                      else self.live.captures.load())
        except DoctorError:
            return {"ranks": [], "unrecorded": {}}
        return {"ranks": [summary.summarize(t) for _, t in sorted(traces.ranks.items())],
                "unrecorded": {str(r): {"why": u.why, "host": u.host}
                               for r, u in sorted(traces.unrecorded.items())}}

    # -- the leader's report -------------------------------------------------------------------
    def nodes_section(self, diagnosis: Diagnosis | None = None) -> dict[str, Any]:
        """What report.json's ``nodes`` says: who diagnosed, every node and its state."""
        link = self.link
        local = sorted(self.live.local())
        nodes = [{"host": self.host, "node_rank": self.rdzv.node_rank, "ranks": local,
                  "role": link.role.value, "state": "ok"}]
        for remote in link.remotes.values():
            state = "lost" if remote.lost else "ended" if remote.beat.get("ended") else "ok"
            nodes.append({"host": remote.host, "node_rank": remote.node_rank,
                          "ranks": sorted({*remote.ranks, *remote.unrecorded}),
                          "role": "follower", "state": state})
        out: dict[str, Any] = {
            "diagnosed_by": {"host": self.host, "node_rank": self.rdzv.node_rank},
            "coordinator": self.rdzv.address, "rendezvous": self.rdzv.source,
            "expected": self.rdzv.nnodes, "nodes": nodes,
        }
        if link.problem:
            out["problem"] = link.problem
        if self.rdzv.nnodes and len(nodes) < self.rdzv.nnodes and link.role is Role.LEADER:
            out["missing"] = self.rdzv.nnodes - len(nodes)
        return out


class FederatedJob(LiveJob):
    """The job as a node's watches see it. The leader's: its own ranks as on one host, the
    followers' ranks through their supervisors (beats, summaries, requests) - the watches cannot
    tell. A follower that lost its leader: its own ranks, and the leader's as lost."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.federation: Federation | None = None

    @property
    def _link(self) -> Link | None:
        fed = self.federation
        return fed.link if fed is not None and fed.leading else None

    def snapshot(self) -> Snapshot:
        snap = super().snapshot()
        fed = self.federation
        if fed is not None and fed.link.role is Role.LEADER:
            fed.link.gather()  # (its store coming up, or failing to, is said here)
        if fed is not None and not fed.leading:
            snap.load = self.union  # alone, or without its leader: the other hosts are unseen
        link = self._link
        if link is None or fed is None:
            return snap
        link.publish_roster({r: (p.host, fed.rdzv.node_rank) for r, p in self.local().items()})
        counts, notes = link.remote_counts()
        snap.counts = {**counts, **snap.counts}
        snap.notes = {**notes, **snap.notes}
        local_poll = snap.poll

        def poll() -> dict[int, int]:
            return {**counts, **(local_poll() if local_poll else {})}

        snap.poll, snap.load = poll, self.union
        return snap

    def union(self, ended: bool = False, evidence: bool = False) -> TraceSet:
        """This node's captures and every follower's ranks, as one job."""
        local = (self.captures.load() if not (ended or evidence) else
                 load_capture_dir(self.out_dir, job_ended=ended, evidence=evidence))
        fed = self.federation
        if fed is not None and fed.link.state is LinkState.LEADER_LOST:
            remote = _lost_with_leader(fed.link, local.world_size)
        elif self._link is not None:
            remote = self._link.remote_traces(fresh=not ended)  # ended: the final summaries
        elif fed is not None and not fed.leading:  # alone: the other hosts' ranks are unseen
            return replace(local, partial=fed.link.problem or "this node diagnosed alone")
        else:
            return local
        part = TraceSet(ranks={t.rank: t for t in remote}, groups=groups_from_notes(remote),
                        world_size=max((t.meta.world_size for t in remote), default=0),
                        unrecorded=self._link.remote_unrecorded() if self._link else {})
        merged = union([local, part], source=local.source)
        if fed is not None and not fed.leading:
            why = fed.link.problem or "this node diagnosed alone"
        else:
            why = "the ranks of nodes that never joined the coordinator are unseen"
        return replace(merged, partial="" if merged.all_accounted_for() else why)

    def procs(self, ranks: Sequence[int] | None = None) -> dict[int, ProcState]:
        out = super().procs(ranks)
        link = self._link
        if link is None:
            return out
        owners = link.owners()
        remote = [r for r in (owners if ranks is None else ranks) if r in owners and r not in out]
        if ranks is None:  # every look: what the beats say (no round trip)
            for r in remote:
                alive = r not in owners[r].beat.get("down", []) and not owners[r].lost
                out[r] = ProcState(0, alive, "unknown" if alive else "gone")
            return out
        for r, raw in link.request("procs", remote, 5.0).items():
            if isinstance(raw, list) and len(raw) == 3:
                out[int(r)] = ProcState(0, bool(raw[0]), str(raw[1]), float(raw[2]))
        return out

    def _ask(self, what: str, ranks: Sequence[int], have: Mapping[int, Any],
             timeout: float) -> dict[int, Any]:
        """rank -> the raw answer of its node's supervisor, for ``ranks`` not in ``have``
        (this host's)."""
        link = self._link
        remote = [r for r in ranks if r not in have]
        if link is None or not remote:
            return {}
        return {int(r): raw for r, raw in link.request(what, remote, timeout).items()}

    def stacks(self, ranks: Sequence[int], timeout: float) -> dict[int, RankStack]:
        out = super().stacks(ranks, timeout)
        for r, raw in self._ask("stacks", ranks, out, timeout).items():
            try:
                out[r] = stack_from_json(raw, r)
            except (ValueError, TypeError):
                continue
        return out

    def flight_recorder(self, ranks: Sequence[int], timeout: float) -> dict[int, dict[str, Any]]:
        out = super().flight_recorder(ranks, timeout)
        out.update((r, raw) for r, raw in self._ask("flight_recorder", ranks, out,
                                                     timeout).items() if isinstance(raw, dict))
        return out

    def unsure(self) -> str:
        link = self._link
        fading = link.fading() if link is not None else []
        if not fading:
            return ""
        return ("waiting to hear from " + ", ".join(f"host {r.host}" for r in fading)
                + " (silent: beating again, or lost)")

    def hosts(self) -> dict[int, str]:
        out = super().hosts()
        link = self._link
        if link is not None:
            for r, remote in link.owners().items():
                out.setdefault(r, remote.host)
        return out



def _lost_with_leader(link: Link, world_size: int) -> list[RankTrace]:
    """The leader's ranks, lost with it (what a follower knows of them: their host)."""
    when = int(link.lost_at_wall * 1e9) or None
    return [lost_rank(r, host, node, when, world_size)
            for r, (host, node) in sorted(link.leader_ranks().items())]
