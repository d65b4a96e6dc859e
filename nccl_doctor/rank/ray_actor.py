"""Which Ray actor this process is, for its capture's metadata (the recorder asks when ``ray``
is imported): reports then say which actors hold which ranks."""

from __future__ import annotations

import sys


def actor_meta() -> dict[str, str]:
    """Which Ray actor this process is ({} outside one): its class, id and name, its node and
    job - written into the rank's capture, so that reports say which actors hold which ranks."""
    ray = sys.modules.get("ray")
    try:
        if ray is None or not ray.is_initialized():
            return {}
        ctx = ray.get_runtime_context()
        actor = ctx.get_actor_id()
        if not actor:
            return {}  # a task, or the driver
        out = {"actor_class": _class_of(ctx), "actor_id": str(actor),
               "actor_name": str(ctx.get_actor_name() or ""), "node_id": str(ctx.get_node_id()),
               "job_id": str(ctx.get_job_id())}
        return {k: v[:200] for k, v in out.items() if v}
    except Exception:  # noqa: BLE001 - a capture without it is still a capture
        return {}


def _class_of(ctx) -> str:
    """The actor's class: from the method it runs ("module.Engine.setup"), else from the process
    title Ray sets ("ray::Engine.setup"; a thread of the actor's own has no current task)."""
    for name in (ctx.get_task_function_name(), _title()):
        parts = str(name or "").split(".")
        if len(parts) >= 2 and parts[-2]:
            return parts[-2]
    return "actor"


def _title() -> str:
    """The method Ray's process title names ("ray::Engine.setup" -> "Engine.setup")."""
    try:
        with open("/proc/self/cmdline", "rb") as fh:
            first = fh.read(256).split(b"\0")[0].decode("utf-8", "replace")
    except OSError:
        return ""
    return first[len("ray::"):] if first.startswith("ray::") else ""
