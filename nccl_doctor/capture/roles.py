"""A rank's role as its capture notes it: the DeviceMesh coordinates and pipeline stages that the
in-rank integration noted (plugins/roles.py, ``{"note": "role", "what": "mesh" | "stage"}``), as
typed values with their JSON form (report.json's ``ranks[].role``). Pure.

The groups a rank is in and a role inferred where nothing was noted are analysis/who/roles.py's.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, Mapping, Sequence


@dataclass(frozen=True)
class MeshPlace:
    """Where a rank sits in one DeviceMesh."""

    dims: tuple[str, ...]  # the mesh's dim names ("dim0", ... when it has none: ``named``)
    shape: tuple[int, ...]
    coords: tuple[int, ...]  # this rank's coordinate on each dim
    groups: tuple[str | None, ...] = ()  # each dim's process group, by torch's name
    named: bool = True

    def to_json(self) -> dict[str, Any]:
        return {"dims": list(self.dims), "shape": list(self.shape), "coords": list(self.coords),
                "groups": list(self.groups), "named": self.named}

    @classmethod
    def from_json(cls, raw: Any) -> MeshPlace:
        if not isinstance(raw, Mapping):
            raise ValueError("a mesh place is a JSON object")
        dims = tuple(str(d) for d in raw.get("dims") or ())
        shape = tuple(int(s) for s in raw.get("shape") or ())
        coords = tuple(int(c) for c in raw.get("coords") or ())
        if not dims or len(dims) != len(shape) or len(dims) != len(coords):
            raise ValueError("a mesh place needs as many dims, sizes and coordinates")
        groups = tuple(None if g is None else str(g) for g in raw.get("groups") or ())
        return cls(dims, shape, coords, groups, bool(raw.get("named", True)))


@dataclass(frozen=True)
class Role:
    """A rank's coordinates: its meshes, its pipeline stages (several under an interleaved
    schedule), the groups it is in. ``inferred``: nothing was noted, the stage was read from
    whom the rank sends to and receives from (analysis/who/roles.py)."""

    meshes: tuple[MeshPlace, ...] = ()
    stages: tuple[int, ...] = ()
    num_stages: int | None = None
    pipeline_group: str | None = None  # the stages' process group (one pipeline replica)
    groups: tuple[str, ...] = ()
    inferred: bool = False

    @property
    def known(self) -> bool:
        """Whether it says anything beyond the groups (a mesh, a stage)."""
        return bool(self.meshes or self.stages)

    def to_json(self) -> dict[str, Any]:
        return {"meshes": [m.to_json() for m in self.meshes], "stages": list(self.stages),
                "num_stages": self.num_stages, "pipeline_group": self.pipeline_group,
                "groups": list(self.groups), "inferred": self.inferred}

    @classmethod
    def from_json(cls, raw: Any) -> Role:
        if not isinstance(raw, Mapping):
            raise ValueError("a role is a JSON object")
        n = raw.get("num_stages")
        group = raw.get("pipeline_group")
        return cls(meshes=tuple(MeshPlace.from_json(m) for m in raw.get("meshes") or ()),
                   stages=tuple(int(s) for s in raw.get("stages") or ()),
                   num_stages=None if n is None else int(n),
                   pipeline_group=None if group is None else str(group),
                   groups=tuple(str(g) for g in raw.get("groups") or ()),
                   inferred=bool(raw.get("inferred", False)))


def noted_role(notes: Sequence[Mapping[str, Any]]) -> Role | None:
    """The role a rank's notes say (None: none noted). A note that does not parse is passed
    over: a capture is input."""
    meshes: list[MeshPlace] = []
    stages: list[int] = []
    role = Role()
    for note in notes:
        if note.get("note") != "role":
            continue
        try:
            if note.get("what") == "mesh":
                place = MeshPlace.from_json(note)
                if place not in meshes:
                    meshes.append(place)
            elif note.get("what") == "stage":
                stage, n = int(note["stage"]), int(note["num_stages"])
                if not 0 <= stage < n:
                    continue
                if stage not in stages:
                    stages.append(stage)
                group = note.get("group")
                role = replace(role, num_stages=n,
                               pipeline_group=None if group is None else str(group))
        except (KeyError, TypeError, ValueError):
            continue
    if not meshes and not stages:
        return None
    return replace(role, meshes=tuple(meshes), stages=tuple(sorted(stages)))
