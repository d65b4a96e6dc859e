"""Did the run of a capture directory end? ``replay`` must not call a hang it cannot know.

A directory whose manifest has no end time is one of three things:

- **running**: its supervisor (the manifest's pid, with the same start time, on this host)
  still runs. Ranks behind their peers may simply be behind;
- **supervisor lost**: ``nccl-doctor run`` was killed (SIGKILL, the OOM killer) and its reaper
  (nccl_doctor/supervisor/reaper.py) stopped the job and kept a ``supervisor_lost`` event in
  ``watchdog.json``. The first replay finishes the manifest: ``ended_at`` is that time and
  ``extra.supervisor_lost_at`` says why;
- **unfinished**: neither - the supervisor died with its reaper (a machine lost), or it runs on
  another host.

In all three the report is the state at that moment, with verdict ``unfinished``, unless the live
watchdog had called a hang before (that stands).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, replace
from pathlib import Path

from nccl_doctor.capture.manifest import Manifest
from nccl_doctor.env import host_name
from nccl_doctor.processes import started
from nccl_doctor.watch_log import WatchLog

LOST = "supervisor_lost_at"


def _when(t: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(t))


@dataclass(frozen=True)
class Lost:
    """The run's supervisor was lost at ``at``; its reaper sent ``signals`` to the job."""

    at: float
    signals: tuple[str, ...] = ()


def lost(manifest: Manifest | None, log: WatchLog | None) -> Lost | None:
    """Whether the run's supervisor was lost (the manifest a replay finished, else the reaper's
    event in ``log``, its ``watchdog.json`` as read once: capture/evidence.py, which also says
    what the reaper sent)."""
    if manifest is None:
        return None
    event = log.lost if log is not None else None
    signals = event.signals if event is not None else ()
    at = manifest.extra.get(LOST)
    if not isinstance(at, (int, float)):
        if manifest.ended_at is not None or event is None:
            return None
        at = event.at
    return Lost(float(at), signals) if isinstance(at, (int, float)) else None


def supervisor_running(manifest: Manifest) -> int | None:
    """The pid of the run's supervisor if it still runs on this host, else None."""
    me = manifest.extra.get("supervisor")
    if not isinstance(me, dict) or me.get("host") != host_name():
        return None
    pid, then = me.get("pid"), me.get("started")
    if not isinstance(pid, int) or pid <= 0:
        return None
    now = started(pid)
    if now is None:
        return None
    try:
        same = then is None or abs(now - float(then)) < 0.01
    except (TypeError, ValueError):
        return None
    return pid if same else None


def unfinished(manifest: Manifest | None, lost: Lost | None) -> str:
    """Why the run's end is unknown ("" : it ended, or there is no manifest to say)."""
    if manifest is None:
        return ""
    if lost is not None:
        sent = ", then ".join(lost.signals)
        stopped = f"; its reaper stopped the job ({sent})" if sent else ""
        return (f"the supervisor (nccl-doctor run) was lost at ~{_when(lost.at)}, killed before "
                f"the job ended{stopped}: this is the job's state at that moment")
    if manifest.ended_at is not None:
        return ""
    pid = supervisor_running(manifest)
    if pid is not None:
        return (f"the job is still running (nccl-doctor run, pid {pid}): this is its state so "
                "far; ranks behind their peers may only be behind")
    me = manifest.extra.get("supervisor")
    where = (f" (pid {me.get('pid')} on {me.get('host')})" if isinstance(me, dict) else "")
    return (f"running or unfinished: no end was recorded and its supervisor{where} is not "
            "running here - killed, or running on another host: this is the job's state when "
            "its captures were last written")


def finish(directory: Path, manifest: Manifest | None, lost: Lost | None) -> None:
    """Write the end of a run whose supervisor was lost into its manifest (best effort: a
    read-only directory is replayed all the same)."""
    if manifest is None or manifest.ended_at is not None or lost is None:
        return
    try:
        replace(manifest, ended_at=lost.at, extra={**manifest.extra, LOST: lost.at}).write(
            directory)
    except OSError:
        pass
