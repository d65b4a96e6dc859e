"""Silent errors while the job runs: the supervisor compares the ranks' hashes (no collective).

Every ``every`` seconds, if any rank wrote a note since the last look (a string-table counter in
each capture's header, in the tick's snapshot), the silent passes run on the snapshot's captures;
every ``calls_every`` seconds, if the ranks made calls since the last look (calls paired across
steps, ``step_skew``, need no note), and never sooner than ten times as long as the last such
look took: a long job's calls are many, and the watch keeps to a tenth of the supervisor's time.
A finding is announced the moment it is established, and returned for report.json with verdict
``suspect`` - the supervisor keeps a standing hang report instead, which outranks it.
"""

from __future__ import annotations

from nccl_doctor.analysis import SILENT_PASSES, analyze
from nccl_doctor.finding_evidence import DegenerateEvidence, SamplingEvidence
from nccl_doctor.diagnosis import Finding, Severity
from nccl_doctor.supervisor.watching import Decision, LiveJob, Report, Snapshot


class SilentWatch:
    """A watch of the supervisor (``look`` once per tick)."""

    what = "silent-error check"  # named when it fails (the supervisor drops it then)

    def __init__(self, job: LiveJob, *, every: float = 2.0, calls_every: float = 5.0) -> None:
        self.job, self.every, self.calls_every = job, every, calls_every
        self.findings: list[Finding] = []  # established so far, in order
        self._seen_notes: dict[int, int] = {}
        self._seen_counts: dict[int, int] = {}
        self._last = self._last_calls = job.clock()
        self._cost = 0.0  # seconds the last look took

    def due(self, now: float) -> float:
        """Seconds from ``now`` to its next look (the supervisor's loop sleeps until then)."""
        return self._last + self.every - now

    def look(self, snap: Snapshot) -> Decision | None:
        if snap.at - self._last < self.every:
            return None
        self._last = snap.at
        noted = snap.notes != self._seen_notes
        called = (snap.counts != self._seen_counts
                  and snap.at - self._last_calls >= max(self.calls_every, 10 * self._cost))
        if not (noted or called):
            return None
        self._seen_notes = dict(snap.notes)
        if called:
            self._seen_counts, self._last_calls = dict(snap.counts), snap.at
        traces = snap.traces
        if traces is None:
            return None
        # silent passes only: a live snapshot may catch ranks mid-collective, which the desync
        # passes would misread; hangs are the watchdog's to call
        started = self.job.clock()
        diagnosis = analyze(traces, SILENT_PASSES, annotators=self.job.annotators)
        self._cost = self.job.clock() - started
        known = {_key(f) for f in self.findings}
        new = [f for f in diagnosis.findings
               if f.severity is not Severity.INFO and _key(f) not in known]
        if not new:
            return None
        self.findings.extend(new)
        return Decision(report=diagnosis, kind=Report.SUSPECT, traces=traces,
                        announce=tuple(f"SUSPECT: {f.kind.value}: {f.title}" for f in new))


def _key(f: Finding) -> tuple:
    """What makes a finding new: its kind and who (titles carry counts that grow as it runs)."""
    e = f.evidence
    classes = (e.classes if isinstance(e, SamplingEvidence)
               else e.criteria if isinstance(e, DegenerateEvidence) else ())
    return (f.kind, f.ranks, repr(classes))
