"""What the live watchdog saw and did, kept beside the captures so ``replay`` reaches the live
verdict (versioned files, written by the supervisor only):

- ``watchdog.json``: its decisions and actions in order - a hang called (how, the situation,
  the policy, the root finding, the calls the ranks were stuck in), the job stopped (signals
  sent), a report retracted, what the backend did afterwards (an NCCL/gloo abort or timeout);
- ``stacks.json``: the stacks taken when the hang was called;
- ``flight_recorder/rank_<R>.json``: each rank's last Flight Recorder pull that fed a decision,
  in Flight Recorder's own JSON form (read back by nccl_doctor/capture/fr_dump.py), at most
  ``MAX_FR_ENTRIES`` entries per rank.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Mapping

from nccl_doctor.capture.names import FR_DIR, STACKS_JSON, WATCH_JSON
from nccl_doctor.files import write_atomic
from nccl_doctor.stacks.rank_stack import RankStack, stack_from_json
from nccl_doctor.watch_log import WatchEvent, WatchLog, event_from_json, events_json
from nccl_doctor import bounded_json

WATCH_FORMAT, STACKS_FORMAT = "nccl-doctor-watchdog", "nccl-doctor-stacks"
VERSION = 1
MAX_EVENTS = 200  # a job retracted and re-called many times keeps its latest decisions
MAX_FR_ENTRIES = 4096  # per rank: Flight Recorder's own default buffer is 2,000


def watch_text(events: tuple[WatchEvent, ...]) -> str:
    """``watchdog.json`` holding ``events`` (the newest ``MAX_EVENTS``)."""
    doc = {"format": WATCH_FORMAT, "version": VERSION,
           "events": events_json(events[-MAX_EVENTS:])}
    return json.dumps(doc, indent=1, default=str) + "\n"


def append_event(directory: Path, entry: WatchEvent) -> None:
    """Add one event to another process's ``watchdog.json`` (the reaper's, once the supervisor
    that kept it is gone; rewritten atomically)."""
    log = read_watch_log(directory) or WatchLog()
    write_atomic(directory / WATCH_JSON, watch_text((*log.events, entry)))


def _read_doc(path: Path, fmt: str) -> dict[str, Any] | None:
    if not path.is_file():
        return None
    try:
        doc = bounded_json.load_file(path)
    except OSError as err:
        raise ValueError(f"{path.name} cannot be read ({err.strerror})") from None
    except bounded_json.JsonDamaged as err:
        raise ValueError(f"{path.name} is damaged: {err}") from None
    if not isinstance(doc, dict) or doc.get("format") != fmt:
        raise ValueError(f"{path.name} is not nccl-doctor's (no \"format\": \"{fmt}\")")
    if doc.get("version") != VERSION:
        raise ValueError(f"{path.name} is version {doc.get('version')!r}; this nccl-doctor "
                         f"reads version {VERSION}")
    return doc


def read_watch_log(directory: Path) -> WatchLog | None:
    """``watchdog.json`` (None when the directory has none). Raises ValueError, with the
    reason, for a file that is damaged or not ours."""
    doc = _read_doc(directory / WATCH_JSON, WATCH_FORMAT)
    if doc is None:
        return None
    events = doc.get("events")
    if not isinstance(events, list):
        raise ValueError(f"{WATCH_JSON} has no events list")
    return WatchLog(tuple(e for e in map(event_from_json, events) if e is not None))


def stacks_text(stacks: Mapping[int, RankStack]) -> str:
    doc = {"format": STACKS_FORMAT, "version": VERSION,
           "ranks": {str(r): s.to_json() for r, s in sorted(stacks.items())}}
    return json.dumps(doc) + "\n"


def read_stacks(directory: Path) -> dict[int, RankStack]:
    """The stacks kept with the hang ({} when none). Raises ValueError for a damaged file."""
    doc = _read_doc(directory / STACKS_JSON, STACKS_FORMAT)
    if doc is None:
        return {}
    ranks = doc.get("ranks")
    if not isinstance(ranks, dict):
        raise ValueError(f"{STACKS_JSON} has no ranks mapping")
    out = {}
    for key, raw in ranks.items():
        if key.isdigit():
            out[int(key)] = stack_from_json(raw, int(key))
    return out


def fr_name(rank: int) -> str:
    """Where rank ``rank``'s kept pull lies, relative to the capture directory."""
    return f"{FR_DIR}/rank_{rank}.json"


def fr_kept(dump: Mapping[str, Any]) -> dict[str, Any]:
    """A pull as kept: its newest ``MAX_FR_ENTRIES`` entries."""
    entries = dump.get("entries")
    kept = dict(dump)
    if isinstance(entries, list) and len(entries) > MAX_FR_ENTRIES:
        kept["entries"] = entries[-MAX_FR_ENTRIES:]
    return kept


def fr_text(dump: Mapping[str, Any]) -> str:
    return json.dumps(dump, default=str) + "\n"
