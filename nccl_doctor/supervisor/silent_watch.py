"""Silent errors while the job runs: the supervisor compares the ranks' hashes (no collective).

Every ``every`` seconds, if any rank wrote a note since the last look (a string-table counter in
each capture's header), the captures are read and the silent passes run. A finding is announced
the moment it is established, and report.json is rewritten with verdict ``suspect`` - unless the
watchdog holds a hang diagnosis, which outranks it.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any, Callable

from nccl_doctor.analysis import SILENT_PASSES, analyze
from nccl_doctor.capture.directory import REPORT_JSON, load_capture_dir
from nccl_doctor.diagnosis import Finding, Severity
from nccl_doctor.errors import DoctorError
from nccl_doctor.reporters.json import write_report
from nccl_doctor.supervisor.watchdog import Watchdog


class SilentWatch:
    """``Supervisor`` listener; shares the watchdog's registry (its header polls)."""

    def __init__(self, out_dir: Path, watchdog: Watchdog, *, every: float = 2.0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.out_dir, self.watchdog, self.every, self.clock = out_dir, watchdog, every, clock
        self.findings: list[Finding] = []  # established so far, in order
        self._seen_notes: dict[int, int] = {}
        self._last = clock()

    what = "silent-error check"  # named when it fails (Supervisor.tick drops it then)

    def __call__(self, _supervisor: Any = None) -> None:
        self.tick()

    def tick(self) -> None:
        now = self.clock()
        if now - self._last < self.every:
            return
        self._last = now
        notes = dict(self.watchdog.registry.notes)  # polled by the watchdog every tick
        if notes == self._seen_notes:
            return
        self._seen_notes = notes
        try:
            traces = load_capture_dir(self.out_dir, job_ended=False)
        except DoctorError:
            return
        # silent passes only: a live snapshot may catch ranks mid-collective, which the desync
        # passes would misread; hangs are the watchdog's to call
        diagnosis = analyze(traces, SILENT_PASSES)
        known = {_key(f) for f in self.findings}
        new = [f for f in diagnosis.findings
               if f.severity is not Severity.INFO and _key(f) not in known]
        if not new:
            return
        self.findings.extend(new)
        for f in new:
            self.watchdog.announce(f"SUSPECT: {f.kind.value}: {f.title}")
        if self.watchdog.diagnosis is None:
            write_report(diagnosis, self.out_dir / REPORT_JSON)


def _key(f: Finding) -> tuple:
    """What makes a finding new: its kind and who (titles carry counts that grow as it runs)."""
    classes = f.evidence.get("classes") or f.evidence.get("criteria") or ()
    return (f.kind, f.ranks, repr(classes))
