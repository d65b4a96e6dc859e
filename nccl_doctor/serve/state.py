"""What ``run --serve`` serves: one immutable look at the job (pure data, and its JSON).

The supervisor's loop makes a new ``Published`` each tick (serve/publisher.py) and swaps it in
with one assignment; the server's threads only read the one they took. Nothing a request does
reaches the watchdog: no lock is shared, no capture is read on a request.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, Mapping

from nccl_doctor.diagnosis import Diagnosis, Finding
from nccl_doctor.status_view import LiveView


@dataclass(frozen=True)
class Published:
    """The job as the supervisor saw it at ``at`` (unix seconds)."""

    at: float
    state: str  # the supervisor's: starting, running, ended, analysing, done
    view: LiveView | None  # the watchdog's live view (None: no watchdog, --no-watch)
    since_progress: Mapping[int, float] = field(default_factory=dict)  # rank -> s since a call
    report: Diagnosis | None = None  # the newest report written (report.json's)
    report_json: str = ""  # that report as report.json holds it
    report_html: str = ""  # report.html as last drawn ("" none yet)
    nodes: Mapping[str, int] = field(default_factory=dict)  # joined, lost, expected
    skew_s: Mapping[int, float] = field(default_factory=dict)  # straggler rank -> median skew
    lateness_s: Mapping[int, float] = field(default_factory=dict)  # rank -> lateness per step
    cost_s: Mapping[int, float] = field(default_factory=dict)  # rank -> peers' wait for it, total
    hung: bool = False  # a hang stood when the job ended (the publisher's, kept to the exit)

    @property
    def hang_detected(self) -> bool:
        """A hang the watchdog called stands: from the call until the process exits - through
        the stop (--on-hang kill), the analysis and the linger - unless progress retracts it
        while the job runs. A state that holds, for an alert to see (docs/serve.md)."""
        return (self.hung or self.verdict == "hang"
                or (self.view is not None and self.view.phase == "hang"))

    @property
    def final(self) -> bool:
        """The run's last look: the job is over, the report is final (served for the linger)."""
        return self.state == "done"

    @property
    def phase(self) -> str:
        """starting, running, computing, waiting_on_peers, ..., ended - then, once the job is
        over, the supervisor's own state (analysing, done). ``hang`` from the call on, to the
        exit, whatever the supervisor does after it (``state`` says that)."""
        if self.hang_detected:
            return "hang"
        if self.state in ("analysing", "done"):
            return self.state
        return self.view.phase if self.view is not None else self.state

    @property
    def verdict(self) -> str:
        return self.report.verdict.value if self.report is not None else "none"

    @property
    def root_cause(self) -> Finding | None:
        return self.report.root_cause if self.report is not None else None

    def status(self) -> dict[str, Any]:
        """``/status.json``: the live page's data."""
        view = self.view
        cause = self.root_cause
        ranks = []
        if view is not None:
            for r in view.ranks:
                ranks.append({"rank": r.rank, "host": r.host, "calls": r.calls,
                              "state": r.state.value, "detail": r.detail,
                              "since_progress_s": round(self.since_progress.get(r.rank, 0.0), 1)})
        return {
            "at": round(self.at, 3), "phase": self.phase, "verdict": self.verdict,
            "state": self.state, "hang_detected": self.hang_detected,
            "message": view.message if view is not None else "",
            "quiet_s": round(view.quiet_s, 1) if view is not None else None,
            "elapsed_s": round(view.elapsed_s, 1) if view is not None else None,
            "root_cause": None if cause is None else {
                "kind": cause.kind.value, "title": cause.title, "ranks": list(cause.ranks),
                "callsite": cause.callsite, "hint": cause.hint,
                "branch": cause.branch_line},
            "findings": [{"kind": f.kind.value, "severity": f.severity.value, "title": f.title}
                         for f in (self.report.findings if self.report is not None else ())],
            "nodes": dict(self.nodes), "ranks": ranks,
        }

    def status_json(self) -> str:
        return json.dumps(self.status(), sort_keys=True)
