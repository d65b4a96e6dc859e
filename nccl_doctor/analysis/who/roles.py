"""Each rank's role, and which ranks are peers of the same role: the rules that compare ranks
(straggler, slow node) compare peers only. Pure.

The last stage of a pipeline arrives last at a collective of the whole world by design (it runs
the loss; the schedule drains through it): compared with the first stage it is "consistently
last" on a healthy job. Compared with another replica's last stage it is not. So a rank's role
is its pipeline stage(s) and its coordinate on the mesh dims that make ranks do different work;
ranks whose roles match are peers.

What a role is made of:

- **Noted** (capture/roles.py: the integration noted a DeviceMesh or a pipeline stage): the
  stages, and the coordinate on every mesh dim that is not one of the symmetric kinds
  (``SYMMETRIC``: data parallel, sharding, tensor, context, sequence and expert parallel, whose
  ranks each do the same work on their own shard). A dim of another name (``pp``, or a name we do
  not know) separates roles; a mesh with no dim names says nothing (which dim is which is not
  known).
- **Inferred** (nothing noted: hand-written pipelines): the position on a chain of ranks that
  send to and receive from each other (at least ``MIN_P2P`` calls between two ranks: a one-off
  exchange is not a pipeline), its head the end that sends first; and the sizes of the groups
  the rank is in. A plain data-parallel job, with no sends, is one role.

A noted rank and an inferred one are never peers (their coordinates are not comparable).
"""

from __future__ import annotations

from collections import Counter, defaultdict
from dataclasses import dataclass, replace
from typing import Hashable

from nccl_doctor.analysis.calls.align import keep_last
from nccl_doctor.analysis.calls.p2p_channels import SENDS, messages
from nccl_doctor.capture.roles import Role, noted_role
from nccl_doctor.model import TraceSet

#: words of a mesh dim's name (split at "_") that say its ranks do the same work on a shard
SYMMETRIC = frozenset({
    "dp", "data", "ddp", "replicate", "shard", "fsdp", "hsdp", "batch",
    "tp", "tensor", "cp", "context", "sp", "sequence", "ep", "expert",
    # torchtitan's expert-parallel meshes: expert tensor parallel, the experts' FSDP and DP
    "etp", "efsdp", "edp",
})
MIN_P2P = 4  # sends and receives between two ranks that make them neighbours in a pipeline


def symmetric(dim: str) -> bool:
    """Whether a mesh dim's ranks do the same work (data, tensor, ... parallel)."""
    return any(word in SYMMETRIC for word in dim.lower().replace("-", "_").split("_"))


@dataclass(frozen=True)
class _Place:
    stage: int
    num_stages: int
    chain: str  # the chain's ranks, head first: one pipeline replica


@keep_last  # the straggler, lateness and balance passes and the report ask in turn
def roles(traces: TraceSet) -> dict[int, Role]:
    """Every recorded rank's role: noted, else inferred from its sends and receives."""
    member_of: dict[int, list[str]] = defaultdict(list)
    for name, info in sorted(traces.groups.items()):
        for r in info.ranks:
            member_of[r].append(name)
    places = _chains(traces)
    out = {}
    for r, trace in traces.ranks.items():
        role = noted_role(trace.notes)
        if role is None:
            place = places.get(r)
            role = Role(inferred=True) if place is None else Role(
                stages=(place.stage,), num_stages=place.num_stages, pipeline_group=place.chain,
                inferred=True)
        out[r] = replace(role, groups=tuple(member_of.get(r, ())))
    return out


#: what the usual mesh dim names mean, as a group's role says it
_DIM_WORDS = {"dp": "data-parallel", "ddp": "data-parallel", "replicate": "replica",
              "dp_replicate": "replica", "shard": "sharding", "fsdp": "sharding",
              "dp_shard": "sharding", "tp": "tensor-parallel", "pp": "pipeline",
              "cp": "context-parallel", "sp": "sequence-parallel", "ep": "expert-parallel"}


@keep_last
def mesh_groups(traces: TraceSet) -> dict[str, str]:
    """group name -> its role on a DeviceMesh the ranks noted: "the data-parallel (dp) group
    [1, 3]" (its dim's name, said in words where it is a usual one; the ranks its members
    noted). A group several meshes hold is named by the first."""
    out: dict[str, str] = {}
    for r, role in sorted(roles(traces).items()):
        for m in role.meshes:
            if not m.named:
                continue
            for dim, group in zip(m.dims, m.groups):
                if group is None or group in out:
                    continue
                ranks = ", ".join(str(x) for x in traces.group_members(group))
                word = _DIM_WORDS.get(dim.lower())
                said = f"{word} ({dim})" if word else dim
                out[group] = f"the {said} group [{ranks}]"
    return out


@keep_last
def peer_keys(traces: TraceSet) -> dict[int, Hashable]:
    """Per rank, a key its peers share and no rank of another role has."""
    sizes = {name: len(info.ranks) for name, info in traces.groups.items()}
    out: dict[int, Hashable] = {}
    for r, role in roles(traces).items():
        if not role.inferred:
            dims = tuple((m.dims, tuple((d, c) for d, c in zip(m.dims, m.coords)
                                        if not symmetric(d))) for m in role.meshes if m.named)
            out[r] = ("noted", role.stages, role.num_stages, dims)
        else:
            shape = tuple(sorted(sizes.get(g, 0) for g in role.groups))
            out[r] = ("inferred", role.stages, role.num_stages, shape)
    return out


def peer_classes(traces: TraceSet, members: tuple[int, ...] | list[int]) -> list[tuple[int, ...]]:
    """``members`` (of one group) split into peers of the same role, in rank order; a rank
    with no peer among them is left out (it has nobody to be compared with)."""
    keys = peer_keys(traces)
    by_key: dict[Hashable, list[int]] = defaultdict(list)
    for r in sorted(members):
        by_key[keys.get(r, ("unknown", r))].append(r)
    return sorted(tuple(c) for c in by_key.values() if len(c) > 1)


def stages_text(stages: tuple[int, ...]) -> str:
    """"stage 1", "stages 0, 2"."""
    return f"stage{'s' if len(stages) > 1 else ''} {', '.join(str(s) for s in stages)}"


def role_text(role: Role) -> str:
    """A role in a few words: "stage 1 of 2, pp=1" ("" for a role that says nothing)."""
    parts = []
    if role.stages:
        of = f" of {role.num_stages}" if role.num_stages else ""
        parts.append(f"{stages_text(role.stages)}{of}"
                     + (" (inferred from its sends and receives)" if role.inferred else ""))
    for m in role.meshes:
        coords = ", ".join(f"{d}={c}" for d, c in zip(m.dims, m.coords) if not symmetric(d))
        if coords and m.named:
            parts.append(coords)
    return ", ".join(parts)


def _chains(traces: TraceSet) -> dict[int, _Place]:
    """The ranks that form chains of sends and receives (pipelines), with their position:
    a chain's head is the end that sends first."""
    calls: Counter = Counter()  # (rank, peer) -> p2p calls from rank to or from peer
    first: dict[int, str] = {}  # rank -> the op of its first p2p call
    for r, trace in traces.ranks.items():
        for e in messages(trace):  # (a send is a record around its isend: counted once)
            if e.peer < 0 or e.peer == r or e.peer not in traces.ranks:
                continue
            calls[r, e.peer] += 1
            first.setdefault(r, e.op)
    near: dict[int, set[int]] = defaultdict(set)
    for (r, peer), n in calls.items():
        if n >= MIN_P2P:
            near[r].add(peer)
            near[peer].add(r)
    out: dict[int, _Place] = {}
    seen: set[int] = set()
    for start in sorted(near):
        if start in seen:
            continue
        part, todo = set(), [start]
        while todo:
            r = todo.pop()
            if r not in part:
                part.add(r)
                todo.extend(near[r] - part)
        seen |= part
        edges = sum(len(near[r]) for r in part) // 2
        if any(len(near[r]) > 2 for r in part) or edges != len(part) - 1:
            continue  # a ring or a star: not a chain of stages
        ends = sorted(r for r in part if len(near[r]) == 1)
        heads = [r for r in ends if first.get(r) in SENDS]
        head = heads[0] if len(heads) == 1 else ends[0]
        order, prev = [head], None
        while len(order) < len(part):
            nxt = next(iter(near[order[-1]] - {prev} - set(order)))
            prev = order[-1]
            order.append(nxt)
        chain = "p2p:" + "-".join(str(r) for r in order)
        for i, r in enumerate(order):
            out[r] = _Place(i, len(order), chain)
    return out
