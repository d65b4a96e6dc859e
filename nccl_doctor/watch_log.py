"""The live watchdog's decisions and actions as kept in a capture directory (``watchdog.json``,
nccl_doctor/capture/watch_record.py), for the analysis to reach the live verdict offline."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

from nccl_doctor.diagnosis import Finding

#: how a stopped rank's signal reads when the user sent it (``run`` forwarded it to the job)
BY_USER = " by the user"
#: What a "stop" event names when the supervisor asked the ranks' agents to exit (no signal).
EXIT_REQUEST = "exit request"


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
        """When the job began to be stopped - by nccl-doctor for the standing hang, else by the
        user's interrupt (None: neither)."""
        stops = self._stops()
        at = stops[0].get("at") if stops else None
        return float(at) if isinstance(at, (int, float)) else None

    @property
    def interrupted(self) -> Mapping[str, Any] | None:
        """The user's first interrupt (Ctrl-C, a scheduler's SIGTERM), forwarded to the job."""
        return next((e for e in self.events if e.get("event") == "interrupted"), None)

    def _stops(self) -> list[Mapping[str, Any]]:
        """What began stopping the job: nccl-doctor, for the standing hang; else the user."""
        if self.hang is not None:
            return self.after_hang("stop")
        return [self.interrupted] if self.interrupted is not None else []

    @property
    def lost(self) -> Mapping[str, Any] | None:
        """The reaper's record that the supervisor was lost and the job stopped (the last)."""
        return next((e for e in reversed(self.events) if e.get("event") == "supervisor_lost"),
                    None)

    @property
    def signals(self) -> tuple[str, ...]:
        return tuple(f"{s}{BY_USER if e.get('by') == 'user' else ''}" for e in self._stops()
                     for s in e.get("signals", ()))

    @property
    def root(self) -> Finding | None:
        hang = self.hang
        raw = hang.get("root") if hang is not None else None
        return Finding.from_json(raw) if isinstance(raw, dict) else None
