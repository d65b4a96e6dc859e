"""How the live watchdog came to its verdict: the ``watchdog`` section of a ``Diagnosis``
(report.json's ``"watchdog"``), with its JSON form in one place."""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any, Mapping


@dataclass(frozen=True)
class WatchAccount:
    situation: str = ""  # deadlock | stall | ... (analysis/calls/situation.py)
    how: str = ""  # which rule called it: deadlock, stuck_peer, stall_comm, ...
    waited_s: float | None = None  # seconds after the last progress
    policy: str = ""  # --on-hang: kill | report
    action: str = ""  # "stopped the job" | "reported"
    # replay only: whether the captures alone name the same root cause (a desync does; a peer
    # seen stuck over several samples is the watchdog's own evidence)
    root_from_captures: bool | None = None
    retracted: bool = False  # progress resumed after the hang was reported
    aftermath: tuple[str, ...] = ()  # what the backend did to the stuck calls afterwards

    def __bool__(self) -> bool:
        return self != WatchAccount()

    def to_json(self) -> dict[str, Any]:
        """Only what is said: an account of no hang is ``{}``."""
        out: dict[str, Any] = {}
        for f in fields(self):
            value = getattr(self, f.name)
            if value is None or value is False or value == "" or value == ():
                continue
            out[f.name] = list(value) if isinstance(value, tuple) else value
        return out

    @classmethod
    def from_json(cls, raw: Any) -> WatchAccount:
        """The account ``to_json`` wrote; what is missing or of the wrong type is left unsaid
        (a kept record is input)."""
        if not isinstance(raw, Mapping):
            return cls()
        waited = raw.get("waited_s")
        rfc = raw.get("root_from_captures")
        after = raw.get("aftermath")
        return cls(
            situation=_text(raw.get("situation")), how=_text(raw.get("how")),
            waited_s=float(waited) if isinstance(waited, (int, float))
            and not isinstance(waited, bool) else None,
            policy=_text(raw.get("policy")), action=_text(raw.get("action")),
            root_from_captures=rfc if isinstance(rfc, bool) else None,
            retracted=raw.get("retracted") is True,
            aftermath=tuple(str(a) for a in after) if isinstance(after, list) else ())


def _text(value: Any) -> str:
    return value if isinstance(value, str) else "" if value is None else str(value)
