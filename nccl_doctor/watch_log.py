"""The live watchdog's decisions and actions as kept in a capture directory (``watchdog.json``,
nccl_doctor/capture/watch_record.py), for the analysis to reach the live verdict offline."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

from nccl_doctor.diagnosis import Finding


@dataclass(frozen=True)
class WatchLog:
    """The watchdog's decisions and actions, oldest first (each a JSON object with ``event``:
    hang | stop | retracted | aftermath, and ``at``: seconds since the epoch)."""

    events: tuple[Mapping[str, Any], ...] = ()

    @property
    def hang(self) -> Mapping[str, Any] | None:
        """The hang that stands: the last one called and not retracted."""
        for e in reversed(self.events):
            if e.get("event") == "retracted":
                return None
            if e.get("event") == "hang":
                return e
        return None

    def after_hang(self, kind: str) -> list[Mapping[str, Any]]:
        """The ``kind`` events since the standing hang was called."""
        hang = self.hang
        if hang is None:
            return []
        start = self.events.index(hang)
        return [e for e in self.events[start:] if e.get("event") == kind]

    @property
    def stopped_at(self) -> float | None:
        """When nccl-doctor began stopping the job for the standing hang (None: it did not)."""
        stops = self.after_hang("stop")
        at = stops[0].get("at") if stops else None
        return float(at) if isinstance(at, (int, float)) else None

    @property
    def signals(self) -> tuple[str, ...]:
        return tuple(str(s) for e in self.after_hang("stop") for s in e.get("signals", ()))

    @property
    def root(self) -> Finding | None:
        hang = self.hang
        raw = hang.get("root") if hang is not None else None
        return Finding.from_json(raw) if isinstance(raw, dict) else None
