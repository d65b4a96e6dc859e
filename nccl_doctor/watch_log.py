"""The live watchdog's decisions and actions as typed values: what the supervisor holds while it
runs, and what ``watchdog.json`` keeps beside the captures (written and read by
nccl_doctor/capture/watch_record.py through ``to_json`` / ``event_from_json`` here, the one
JSON form), so that the end of a run and a replay analyse the same events.

- ``HangCalled``: a hang called - how (``WatchAccount``), its root finding, the calls the ranks
  were stuck in, and the live report itself;
- ``Stopped``: the job being stopped (the signals sent, or an exit request);
- ``Interrupted``: the user's interrupt, forwarded to the job;
- ``Retracted``: progress resumed after a reported hang;
- ``Aftermath``: what the backend did to the stuck calls after the hang was called;
- ``SupervisorLost``: the reaper's record that the supervisor was lost and the job stopped.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field, replace
from typing import Any, ClassVar, Mapping, Union

from nccl_doctor.diagnosis import Diagnosis, Finding
from nccl_doctor.words import BY_USER
from nccl_doctor.watch_account import WatchAccount

#: What a ``Stopped`` event names when the supervisor asked the ranks' agents to exit (no signal).
EXIT_REQUEST = "exit request"


def now() -> float:
    return round(time.time(), 3)


def _signals(raw: Any) -> tuple[str, ...]:
    return tuple(str(s) for s in raw) if isinstance(raw, list) else ()


@dataclass(frozen=True)
class HangCalled:
    KIND: ClassVar[str] = "hang"
    account: WatchAccount
    root: Finding | None = None
    stuck: Mapping[int, tuple[str, int]] = field(default_factory=dict)  # rank -> (group, seq)
    # the live report when the hang was called (None in records of nccl-doctor before 0.9,
    # which kept the root finding only: replay rebuilds the report from it)
    report: Diagnosis | None = None
    at: float = field(default_factory=now)

    def to_json(self) -> dict[str, Any]:
        return {"event": self.KIND, "at": self.at, "watchdog": self.account.to_json(),
                "root": self.root.to_json() if self.root is not None else None,
                "stuck": {str(r): [g, q] for r, (g, q) in self.stuck.items()},
                **({"report": self.report.to_json()} if self.report is not None else {})}

    @classmethod
    def from_json(cls, raw: Mapping[str, Any], at: float) -> HangCalled:
        root = raw.get("root")
        report = raw.get("report")
        stuck: dict[int, tuple[str, int]] = {}
        for r, gq in (raw.get("stuck") or {}).items() if isinstance(raw.get("stuck"), dict) else ():
            if str(r).isdigit() and isinstance(gq, list) and len(gq) == 2:
                try:
                    stuck[int(r)] = (str(gq[0]), int(gq[1]))
                except (TypeError, ValueError):
                    continue
        return cls(account=WatchAccount.from_json(raw.get("watchdog")),
                   root=Finding.from_json(root) if isinstance(root, dict) else None,
                   stuck=stuck,
                   report=Diagnosis.from_json(report) if isinstance(report, dict) else None,
                   at=at)


@dataclass(frozen=True)
class Stopped:
    KIND: ClassVar[str] = "stop"
    signals: tuple[str, ...] = ()  # in the order sent (or ``EXIT_REQUEST``)
    at: float = field(default_factory=now)

    def to_json(self) -> dict[str, Any]:
        return {"event": self.KIND, "at": self.at, "signals": list(self.signals)}

    @classmethod
    def from_json(cls, raw: Mapping[str, Any], at: float) -> Stopped:
        return cls(_signals(raw.get("signals")), at)


@dataclass(frozen=True)
class Interrupted:
    KIND: ClassVar[str] = "interrupted"
    signals: tuple[str, ...] = ()
    by: str = "user"  # from outside nccl-doctor (its own stops are Stopped)
    at: float = field(default_factory=now)
    # who sent it, as far as is known (supervisor/senders.py): "the terminal (Ctrl-C)", "pid
    # 4242 (kill -TERM 4000, uid 1000)", "Slurm: its time limit (1:00:00, ending 14:40:00)"
    sender: str = ""

    def to_json(self) -> dict[str, Any]:
        return {"event": self.KIND, "at": self.at, "signals": list(self.signals), "by": self.by,
                **({"sender": self.sender} if self.sender else {})}

    @classmethod
    def from_json(cls, raw: Mapping[str, Any], at: float) -> Interrupted:
        return cls(_signals(raw.get("signals")), str(raw.get("by") or "user"), at,
                   str(raw.get("sender") or "")[:MAX_SENDER])


#: characters of a sender kept from a record (it is input: bounded)
MAX_SENDER = 300


@dataclass(frozen=True)
class Retracted:
    KIND: ClassVar[str] = "retracted"
    at: float = field(default_factory=now)

    def to_json(self) -> dict[str, Any]:
        return {"event": self.KIND, "at": self.at}

    @classmethod
    def from_json(cls, raw: Mapping[str, Any], at: float) -> Retracted:
        return cls(at)


@dataclass(frozen=True)
class Aftermath:
    KIND: ClassVar[str] = "aftermath"
    what: str
    at: float = field(default_factory=now)

    def to_json(self) -> dict[str, Any]:
        return {"event": self.KIND, "at": self.at, "what": self.what}

    @classmethod
    def from_json(cls, raw: Mapping[str, Any], at: float) -> Aftermath:
        return cls(str(raw.get("what") or ""), at)


@dataclass(frozen=True)
class SupervisorLost:
    KIND: ClassVar[str] = "supervisor_lost"
    signals: tuple[str, ...] = ()  # what the reaper sent the job
    at: float = field(default_factory=now)

    def to_json(self) -> dict[str, Any]:
        return {"event": self.KIND, "at": self.at, "signals": list(self.signals)}

    @classmethod
    def from_json(cls, raw: Mapping[str, Any], at: float) -> SupervisorLost:
        return cls(_signals(raw.get("signals")), at)


WatchEvent = Union[HangCalled, Stopped, Interrupted, Retracted, Aftermath, SupervisorLost]
_KINDS: dict[str, Any] = {c.KIND: c for c in (HangCalled, Stopped, Interrupted, Retracted,
                                               Aftermath, SupervisorLost)}


def event_from_json(raw: Any) -> WatchEvent | None:
    """The event ``to_json`` wrote; None for anything else (a kept record is input; an event
    of a later nccl-doctor is passed over)."""
    if not isinstance(raw, Mapping):
        return None
    kind = _KINDS.get(raw.get("event"))  # type: ignore[arg-type]
    at = raw.get("at")
    if kind is None or not isinstance(at, (int, float)) or isinstance(at, bool):
        return None
    return kind.from_json(raw, float(at))


def events_json(events: tuple[WatchEvent, ...]) -> list[dict[str, Any]]:
    """The events' JSON form; the live report is kept with the standing hang only (an earlier,
    retracted one keeps its root finding), which bounds the file."""
    last_hang = max((i for i, e in enumerate(events) if isinstance(e, HangCalled)), default=-1)
    return [(replace(e, report=None) if isinstance(e, HangCalled) and i != last_hang else e)
            .to_json() for i, e in enumerate(events)]


@dataclass(frozen=True)
class WatchLog:
    """The watchdog's decisions and actions, oldest first."""

    events: tuple[WatchEvent, ...] = ()

    @property
    def hang(self) -> HangCalled | None:
        """The hang that stands: the last one called and not retracted."""
        for e in reversed(self.events):
            if isinstance(e, Retracted):
                return None
            if isinstance(e, HangCalled):
                return e
        return None

    def _since_hang(self) -> tuple[WatchEvent, ...]:
        hang = self.hang
        return () if hang is None else self.events[self.events.index(hang):]

    @property
    def aftermath(self) -> tuple[str, ...]:
        """What the backend did to the stuck calls since the standing hang was called."""
        return tuple(e.what for e in self._since_hang() if isinstance(e, Aftermath) and e.what)

    @property
    def stopped_at(self) -> float | None:
        """When the job began to be stopped - by nccl-doctor for the standing hang, else by the
        user's interrupt (None: neither)."""
        stops = self._stops()
        return stops[0].at if stops else None

    @property
    def interrupted(self) -> Interrupted | None:
        """The user's first interrupt (Ctrl-C, a scheduler's SIGTERM), forwarded to the job."""
        return next((e for e in self.events if isinstance(e, Interrupted)), None)

    def _stops(self) -> list[Stopped | Interrupted]:
        """What began stopping the job: nccl-doctor, for the standing hang (or the user, when
        nccl-doctor left the hung job running: --on-hang report); else the user."""
        if self.hang is not None:
            since = self._since_hang()
            return ([e for e in since if isinstance(e, Stopped)]
                    or [e for e in since if isinstance(e, Interrupted)][:1])
        return [self.interrupted] if self.interrupted is not None else []

    @property
    def interrupted_after_hang(self) -> Interrupted | None:
        """The user's interrupt that ended a job nccl-doctor left running once it called the
        standing hang (--on-hang report)."""
        stops = self._stops() if self.hang is not None else []
        return stops[0] if stops and isinstance(stops[0], Interrupted) else None

    @property
    def lost(self) -> SupervisorLost | None:
        """The reaper's record that the supervisor was lost and the job stopped (the last)."""
        return next((e for e in reversed(self.events) if isinstance(e, SupervisorLost)), None)

    @property
    def signals(self) -> tuple[str, ...]:
        return tuple(f"{s}{BY_USER if isinstance(e, Interrupted) and e.by == 'user' else ''}"
                     for e in self._stops() for s in e.signals)

    @property
    def root(self) -> Finding | None:
        hang = self.hang
        return hang.root if hang is not None else None
