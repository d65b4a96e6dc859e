"""The job as a node's watches see it in a multi-node run (``FederatedJob``): the leader's own
ranks as on one host, the followers' ranks through their supervisors - the watches cannot tell.
A follower that lost its leader: its own ranks, and the leader's as lost."""

from __future__ import annotations

from dataclasses import replace
from typing import Any, Mapping, Sequence

from nccl_doctor.analysis.calls.ends import Ending, with_ends_known
from nccl_doctor.analysis.calls.situation import ProcState
from nccl_doctor.capture.assemble import groups_from_notes
from nccl_doctor.capture.union import union
from nccl_doctor.model import RankTrace, TraceSet
from nccl_doctor.stacks.rank_stack import RankStack, stack_from_json
from nccl_doctor.supervisor.federation.link import Follower, Leader, LinkState, unseen_rank
from nccl_doctor.supervisor.federation.node import Federation
from nccl_doctor.supervisor.watching import LiveJob, Snapshot


class FederatedJob(LiveJob):
    """The job as a node's watches see it. The leader's: its own ranks as on one host, the
    followers' ranks through their supervisors (beats, summaries, requests) - the watches cannot
    tell. A follower that lost its leader: its own ranks, and the leader's as lost."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.federation: Federation | None = None

    @property
    def _link(self) -> Leader | None:
        """The leader's part, once the nodes have met with a key (None: this node follows, is
        alone, or met the others unauthenticated: their word is not evidence)."""
        fed = self.federation
        return fed.leader if fed is not None and fed.pooled else None

    def snapshot(self) -> Snapshot:
        snap = super().snapshot()
        fed = self.federation
        if fed is not None and fed.leader is not None:
            fed.leader.gather()  # (its store coming up, or failing to, is said here)
        if fed is not None and not fed.pooled:
            snap.load = self.union  # alone, without its leader, or unauthenticated: the other
            # hosts are unseen
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

    def union(self, ended: bool = False) -> TraceSet:
        """This node's captures and every follower's ranks, as one job (``ended``: at the
        job's end, with the watchdog's evidence)."""
        local = self.final() if ended else self.captures.load()
        fed = self.federation
        lost: dict[int, tuple[str, int | None]] = {}
        follower = fed.follower if fed is not None else None
        if fed is not None and not fed.trusted:  # nothing of the store is evidence
            return replace(local, partial=fed.unpooled)
        if follower is not None and fed is not None and fed.state is LinkState.LEADER_LOST:
            remote = _with_leader(follower, local.world_size)
            when = int(fed.transport.lost_at_wall * 1e9) or None
            lost = {t.rank: (t.meta.host, when) for t in remote}
        elif self._link is not None:
            remote = self._link.remote_traces(fresh=not ended)  # ended: the final summaries
            lost = self._link.lost_ranks()
        elif fed is not None and not fed.leading:  # alone: the other hosts' ranks are unseen
            return replace(local, partial=fed.unpooled)
        else:
            return local
        part = TraceSet(ranks={t.rank: t for t in remote}, groups=groups_from_notes(remote),
                        world_size=max((t.meta.world_size for t in remote), default=0),
                        unrecorded=self._link.remote_unrecorded() if self._link else {})
        merged = union([local, part], source=local.source)
        if fed is not None and not fed.leading:
            why = fed.problem or "this node diagnosed alone"
        else:
            why = "the ranks of nodes that never joined the coordinator are unseen"
        merged = with_ends_known(merged, Ending(lost=lost))
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

    def flight_recorder(self, ranks: Sequence[int], timeout: float,
                        stacks: bool = False) -> dict[int, dict[str, Any]]:
        out = super().flight_recorder(ranks, timeout, stacks)
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


def _with_leader(link: Follower, world_size: int) -> list[RankTrace]:
    """The leader's ranks, lost with it (what a follower knows of them: their host)."""
    return [unseen_rank(r, host, node, world_size)
            for r, (host, node) in sorted(link.leader_ranks().items())]
