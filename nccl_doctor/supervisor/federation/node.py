"""This supervisor's part in a multi-node job: where it meets the others, its link, what it
serves the leader from its own host (stacks, process states, Flight Recorder pulls, its ranks in
brief) and what report.json says of the nodes."""

from __future__ import annotations

import ipaddress
import socket
from typing import Any, Callable

from nccl_doctor import env
from nccl_doctor.capture import summary
from nccl_doctor.diagnosis import Diagnosis
from nccl_doctor.errors import DoctorError
from nccl_doctor.supervisor.federation.link import Link, LinkState, Local, Role
from nccl_doctor.supervisor.federation.rendezvous import Rendezvous
from nccl_doctor.supervisor.live import LiveJob

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


class Federation:
    """This supervisor's part in a multi-node job."""

    def __init__(self, rdzv: Rendezvous, live: LiveJob, host: str, *,
                 announce: Callable[[str], None], **link_options: Any) -> None:
        self.live, self.host = live, host
        self.link = Link(rdzv, host, announce=announce, answer=self._answer,
                         summaries=self._summaries, clock=live.clock, **link_options)

    @property
    def rdzv(self) -> Rendezvous:
        """Where the nodes meet, as the link holds it (a Ray run's leader learns its node count
        as the node doctors start: Leader.expect)."""
        return self.link.rdzv

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
            traces = self.live.final() if ended else self.live.captures.load()
        except DoctorError:
            return {"ranks": [], "unrecorded": {}}
        return {"ranks": [summary.summarize(t) for _, t in sorted(traces.ranks.items())],
                "unrecorded": {str(r): {"why": u.why, "host": u.host}
                               for r, u in sorted(traces.unrecorded.items())}}

    def trust_notes(self) -> tuple[str, ...]:
        """What the report says of who could be heard on the coordinator's store."""
        link = self.link
        if link.state is LinkState.ALONE and not link.remotes:
            return ()  # the nodes never met: nothing was exchanged
        if link.key is None:
            return (f"the nodes' supervisors met on {self.rdzv.address} unauthenticated, as "
                    "torch's own store: any process that reaches that port could write to it. "
                    f"Give every node the same key ({env.FEDERATION_KEY} or "
                    f"{env.FEDERATION_KEY_FILE}) to authenticate what they exchange",)
        n = link.rejected
        if n:
            values, were = (f"{n} values", "were") if n != 1 else ("1 value", "was")
            return (f"{values} on the coordinator's store at {self.rdzv.address} failed "
                    f"authentication and {were} ignored: something other than this job's doctors "
                    "wrote there, or a node runs with another key",)
        return ()

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
        out["authenticated"] = link.key is not None
        if link.rejected:
            out["rejected"] = link.rejected
        if self.rdzv.nnodes and len(nodes) < self.rdzv.nnodes and link.role is Role.LEADER:
            out["missing"] = self.rdzv.nnodes - len(nodes)
        return out
