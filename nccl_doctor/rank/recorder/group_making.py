"""Process-group creation, noted per rank: the ranks asked for, the name torch gives the group,
and whether the call came back.

torch names a group by how many groups the rank has made (``_world.group_count``), unless it
is made with ``use_local_synchronization=True`` (a hash of its ranks). A ``new_group`` made by
some ranks only, or in another order, leaves every later group with different names on
different ranks, and each rank waits inside ``new_group`` for peers registering under another
name: no collective is pending anywhere. These notes are what the analysis
(nccl_doctor/analysis/what/groups.py) compares across ranks. Group creation is rare, so a note (a
JSON line in the capture's string table) costs nothing that matters; the note before the call
is written before the rank can block in it.
"""

from __future__ import annotations

import functools
import inspect
from typing import Any, Callable

#: The parameter holding the ranks each group-making function is asked for.
_RANKS_PARAM = {"new_group": "ranks", "split_group": "split_ranks",
                "new_subgroups_by_enumeration": "ranks_per_subgroup_list"}


def making_groups(rec: Any, recorded: Callable, name: str) -> Callable:
    """``recorded`` (the recorded ``new_group``, ``new_subgroups``, ``split_group``...) with a
    ``group_call`` note before it runs and a ``group_made`` note once it returns."""
    try:
        signature: inspect.Signature | None = inspect.signature(recorded)
    except (TypeError, ValueError):
        signature = None
    ranks_param = _RANKS_PARAM.get(name)

    @functools.wraps(recorded)
    def making(*args: Any, **kwargs: Any) -> Any:
        w = rec.writer
        if w is None or not rec.enabled:
            return recorded(*args, **kwargs)
        order = -1
        try:
            order = rec.group_calls
            rec.group_calls += 1
            bound = _bound(signature, args, kwargs)
            w.note("group_call", **_asked(rec, name, order, bound, ranks_param, w.count + 1))
        except Exception as err:  # noqa: BLE001 - never into the job: the recorder goes quiet
            rec.fail(err)
            return recorded(*args, **kwargs)
        try:
            result = recorded(*args, **kwargs)
        except BaseException as err:
            try:
                w.note("group_made", order=order, op=name, failed=type(err).__name__)
            except Exception:  # noqa: BLE001
                pass
            raise
        try:
            w.note("group_made", **_made(rec, name, order, result))
        except Exception as err:  # noqa: BLE001
            rec.fail(err)
        return result

    making.__nccl_doctor__ = True  # type: ignore[attr-defined]
    making.__wrapped__ = getattr(recorded, "__wrapped__", recorded)  # type: ignore[attr-defined]
    return making


def _bound(signature: inspect.Signature | None, args: tuple, kwargs: dict) -> dict[str, Any]:
    if signature is None:
        return dict(kwargs)
    try:
        return dict(signature.bind_partial(*args, **kwargs).arguments)
    except TypeError:
        return dict(kwargs)


def _asked(rec: Any, name: str, order: int, bound: dict[str, Any], ranks_param: str | None,
           idx: int) -> dict[str, Any]:
    """What the call asks for, and the name torch will give it on this rank."""
    c10d = rec.c10d
    fields: dict[str, Any] = {"order": order, "op": name, "idx": idx}
    raw = bound.get(ranks_param) if ranks_param else None
    if name == "new_subgroups":
        fields["group_size"] = _int(bound.get("group_size"))
    elif raw is not None:
        try:
            if name == "new_subgroups_by_enumeration":
                fields["ranks"] = [sorted(int(r) for r in sub) for sub in raw][:64]
            else:
                fields["ranks"] = [int(r) for r in raw][:4096]
        except (TypeError, ValueError):
            pass
    local = bool(bound.get("use_local_synchronization", False))
    if local:
        fields["local"] = True
    world = getattr(c10d, "_world", None)
    count = getattr(world, "group_count", None)
    if isinstance(count, int):
        fields["count"] = count  # a new_group not made locally is named str(count)
    return fields


def _made(rec: Any, name: str, order: int, result: Any) -> dict[str, Any]:
    c10d = rec.c10d
    fields: dict[str, Any] = {"order": order, "op": name}
    world = getattr(c10d, "_world", None)
    count = getattr(world, "group_count", None)
    if isinstance(count, int):
        fields["count"] = count
    pgs = result if isinstance(result, tuple) else (result,)  # new_subgroups: (mine, all)
    pg = pgs[0]
    if pg is None or isinstance(pg, int) or not hasattr(pg, "size"):
        fields["member"] = False  # NON_GROUP_MEMBER: this rank is not in the group
        return fields
    try:
        fields["name"] = str(c10d._get_process_group_name(pg))
        fields["ranks"] = [int(r) for r in c10d.get_process_group_ranks(pg)][:4096]
    except Exception:  # noqa: BLE001 - a group torch no longer knows: the call is still noted
        pass
    return fields


def _int(value: Any) -> int | None:
    return value if isinstance(value, int) else None
