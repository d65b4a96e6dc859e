"""Which Ray actors hold which ranks, and what each process group is between them (pure).

A rank recorded inside a Ray actor carries the actor's class, id and name
(``RankMeta.ray``). A group is named by the classes of its ranks: the group of one class
("Trainer group"), the world, and a *weight-sync group* - one rank of a class whose other ranks
stay outside it, with every rank of another class (trainer rank 0 broadcasting its weights to the
rollout engines: OpenRLHF's and verl's layout, docs/bugs.md D).
"""

from __future__ import annotations

from dataclasses import dataclass

from nccl_doctor.analysis.calls.wording import ranks_text
from nccl_doctor.model import TraceSet
from nccl_doctor.sections import Ray, RayActor, RayGroup


@dataclass(frozen=True)
class Actor:
    rank: int
    cls: str
    id: str
    name: str
    host: str

    @property
    def label(self) -> str:
        """"Engine 1a2b3c4d" (or the actor's name when it has one)."""
        return f"{self.cls} {self.name or self.id[:8]}"


def actors(traces: TraceSet) -> dict[int, Actor]:
    """rank -> the Ray actor that holds it (ranks outside actors are left out)."""
    out = {}
    for rank, trace in traces.ranks.items():
        ray = trace.meta.ray
        if ray.get("actor_id"):
            out[rank] = Actor(rank, ray.get("actor_class") or "actor", ray["actor_id"],
                              ray.get("actor_name", ""), trace.meta.host)
    return out


def _classes(ranks: list[int], held: dict[int, Actor]) -> dict[str, list[int]]:
    out: dict[str, list[int]] = {}
    for r in sorted(ranks):
        out.setdefault(held[r].cls, []).append(r)
    return out


def group_roles(traces: TraceSet, held: dict[int, Actor] | None = None) -> dict[str, str]:
    """group name -> what the group is between the actors (only groups whose every rank is an
    actor's)."""
    held = actors(traces) if held is None else held
    if not held:
        return {}
    everyone = _classes(list(held), held)
    out = {}
    for name, group in traces.groups.items():
        ranks = list(group.ranks)
        if not ranks or any(r not in held for r in ranks):
            continue
        mine = _classes(ranks, held)
        said = " + ".join(f"{cls} {ranks_text(rs)}" for cls, rs in mine.items())
        if len(mine) == 1:
            out[name] = f"{next(iter(mine))} group ({ranks_text(ranks)})"
        elif len(ranks) >= len(held):
            out[name] = f"the world ({said})"
        else:
            single = [c for c, rs in mine.items() if len(rs) == 1 and len(everyone[c]) > 1]
            if len(mine) == 2 and len(single) == 1:
                other = next(c for c in mine if c != single[0])
                if mine[other] == everyone[other]:
                    out[name] = (f"weight-sync group ({single[0]} {ranks_text(mine[single[0]])} "
                                 f"-> {other} {ranks_text(mine[other])})")
                    continue
            out[name] = f"group of {said}"
    return out


def summary(traces: TraceSet) -> Ray | None:
    """The report's ``ray``: each actor's rank and the groups between them (None for a job
    with no Ray actor)."""
    held = actors(traces)
    if not held:
        return None
    roles = group_roles(traces, held)
    return Ray(
        actors={r: RayActor(class_name=a.cls, id=a.id, name=a.name, host=a.host)
                for r, a in sorted(held.items())},
        groups={name: RayGroup(ranks=tuple(traces.groups[name].ranks), role=role)
                for name, role in sorted(roles.items())})
