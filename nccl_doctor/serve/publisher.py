"""The supervisor's side of ``run --serve``: each tick, one new ``Published`` look at the job,
swapped in by one assignment (a listener of the supervisor: it reads what the supervisor and
its watches already hold, never a capture)."""

from __future__ import annotations

import time
from dataclasses import replace
from typing import TYPE_CHECKING, Callable

from nccl_doctor.diagnosis import Diagnosis, Verdict
from nccl_doctor.status_view import LiveView, RankState, RankView
from nccl_doctor.serve.state import Published

if TYPE_CHECKING:
    from nccl_doctor.supervisor.supervisor import Supervisor


class Publisher:
    """``current``: the newest look (what the server's threads read)."""

    def __init__(self, page: Callable[[], str] = lambda: "") -> None:
        self.page = page
        self.current = Published(at=time.time(), state="starting", view=None)
        self._counts: dict[int, tuple[int, float]] = {}  # rank -> (calls, when they moved)
        self._report: tuple[object, str] = (None, "")
        self._seen: dict[int, RankView] = {}  # every rank's last line
        self._hung = False  # the watchdog's hang stood at the newest look

    def __call__(self, supervisor: Supervisor) -> None:
        self.current = self.look(supervisor)

    def look(self, supervisor: Supervisor) -> Published:
        now = time.time()
        files = supervisor.live.run_files
        report = files.report
        if report is not self._report[0]:  # the text report.json holds: serialised once
            self._report = (report, files.report_text if report is not None else "")
        view = supervisor.view()
        if view is not None:
            view = self._every_rank(view, supervisor.state.value, report)
        since = {}
        for r in view.ranks if view is not None else ():
            held = self._counts.get(r.rank)
            if held is None or held[0] != r.calls:
                held = self._counts[r.rank] = (r.calls, now)
            since[r.rank] = now - held[1]
        straggler = supervisor.straggler
        state = supervisor.state.value
        standing = ((report is not None and report.verdict is Verdict.HANG)
                    or (view is not None and view.phase == "hang"))
        # while the job runs, progress may retract a hang; once it is over, a hang that stood
        # at its end stands to the exit, whatever the final report (docs/serve.md)
        self._hung = standing or (self._hung and state not in ("starting", "running"))
        return Published(
            at=now, state=state, view=view, since_progress=since, hung=self._hung,
            report=report, report_json=self._report[1], report_html=self.page(),
            nodes=_nodes(supervisor), skew_s=dict(straggler.skew) if straggler else {},
            lateness_s=dict(straggler.lateness) if straggler else {},
            cost_s=dict(straggler.cost) if straggler else {})

    def _every_rank(self, view: LiveView, state: str, report: Diagnosis | None) -> LiveView:
        """``view`` with every rank seen so far: a rank the watchdog no longer counts (another
        node's, once that node ended) keeps its last line; once the job is over, every rank has
        ended, as the report says."""
        for r in view.ranks:
            self._seen[r.rank] = r
        ranks = [self._seen[k] for k in sorted(self._seen)]
        if state in ("analysing", "done"):
            told = {s.rank: s for s in report.ranks} if report is not None else {}
            for rank, s in told.items():  # (a rank no look ever counted: a job too short)
                if rank not in self._seen:
                    calls = s.capture.events if s.capture is not None else 0
                    self._seen[rank] = RankView(rank, s.host, calls, RankState.ENDED)
            ranks = [replace(r, state=RankState.ENDED,
                             detail=told[r.rank].state if r.rank in told else "")
                     for r in (self._seen[k] for k in sorted(self._seen))]
        return replace(view, ranks=tuple(ranks))


def _nodes(supervisor: Supervisor) -> dict[str, int]:
    fed = supervisor.federation
    if fed is None or not fed.leading:
        return {"joined": 1}
    remotes = list(fed.remotes.values())
    lost = sum(1 for r in remotes if r.lost)
    out = {"joined": 1 + len(remotes) - lost, "lost": lost}
    if fed.rdzv.nnodes:
        out["expected"] = int(fed.rdzv.nnodes)
    return out
