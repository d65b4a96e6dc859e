"""A rank's coordinates, noted where torch gives them: a DeviceMesh (its dims, its shape, this
rank's coordinate, the group of each dim) and a pipeline stage (``torch.distributed.pipelining``:
the stage's index, the stage count, its group).

The straggler and slow-node rules compare ranks of the same role only (analysis/who/roles.py): the
last stage of a pipeline arrives last by design, so the rank to compare it with is another
replica's last stage, which only these coordinates say. Each hook calls the original first and
then notes (nccl_doctor.rank.hooks.note_role); nothing here ever raises into the job.
"""

from __future__ import annotations

import functools
from typing import Any, Callable

from nccl_doctor.rank import hooks


def patch_device_mesh(module: Any) -> None:
    """``torch.distributed.device_mesh``: every root DeviceMesh this rank is part of."""
    mesh_cls = getattr(module, "DeviceMesh", None)
    if mesh_cls is not None:
        _after_init(mesh_cls, _note_mesh)


def patch_pipeline_stage(module: Any) -> None:
    """``torch.distributed.pipelining.stage``: every stage this rank holds (several under an
    interleaved schedule)."""
    base = getattr(module, "_PipelineStageBase", None)
    if base is not None:
        _after_init(base, _note_stage)


def _after_init(cls: type, note: Callable[[Any], None]) -> None:
    init = cls.__dict__.get("__init__")
    if init is None or getattr(init, "__nccl_doctor__", False):
        return

    @functools.wraps(init)
    def noted_init(self: Any, *args: Any, **kwargs: Any) -> None:
        init(self, *args, **kwargs)
        # (a subclass - PipelineStage - calls this from its own __init__: what is noted is
        # set by the base's, so the note is complete here)
        try:
            note(self)
        except Exception:  # noqa: BLE001 - a coordinate is never worth the job
            pass

    noted_init.__nccl_doctor__ = True  # type: ignore[attr-defined]
    cls.__init__ = noted_init  # type: ignore[misc]


def _group_name(group: Any) -> str | None:
    from torch.distributed import distributed_c10d as c10d

    try:
        pg = group if group is not None else c10d._get_default_group()
        return str(c10d._get_process_group_name(pg))
    except Exception:  # noqa: BLE001
        return None


def _note_mesh(mesh: Any) -> None:
    if getattr(mesh, "_root_mesh", None) is not None:
        return  # a slice or a flattening of a mesh noted already: same coordinates
    coords = mesh.get_coordinate()
    if coords is None:
        return  # this rank is not part of it
    ndim = int(mesh.ndim)
    groups: list[str | None] = []
    for dim in range(ndim):
        try:
            groups.append(_group_name(mesh.get_group(dim)))
        except Exception:  # noqa: BLE001 - a mesh made without its groups (_init_backend=False)
            groups.append(None)
    names = mesh.mesh_dim_names
    hooks.note_role(
        "mesh", dims=list(names) if names else [f"dim{i}" for i in range(ndim)],
        named=bool(names), shape=[int(s) for s in mesh.shape], coords=[int(c) for c in coords],
        groups=groups)


def _note_stage(stage: Any) -> None:
    hooks.note_role(
        "stage", stage=int(stage.stage_index), num_stages=int(stage.num_stages),
        group=_group_name(getattr(stage, "group", None)))
