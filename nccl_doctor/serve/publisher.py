"""The supervisor's side of ``run --serve``: each tick, one new ``Published`` look at the job,
swapped in by one assignment (a listener of the supervisor: it reads what the supervisor and
its watches already hold, never a capture)."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Callable

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

    def __call__(self, supervisor: Supervisor) -> None:
        self.current = self.look(supervisor)

    def look(self, supervisor: Supervisor) -> Published:
        now = time.time()
        view = supervisor.view()
        since = {}
        for r in view.ranks if view is not None else ():
            held = self._counts.get(r.rank)
            if held is None or held[0] != r.calls:
                held = self._counts[r.rank] = (r.calls, now)
            since[r.rank] = now - held[1]
        report = supervisor.live.kept.report
        if report is not self._report[0]:  # drawn once per report, as report.json is
            self._report = (report, report.to_json_text() if report is not None else "")
        straggler = supervisor.straggler
        return Published(
            at=now, state=supervisor.state.value, view=view, since_progress=since,
            report=report, report_json=self._report[1], report_html=self.page(),
            nodes=_nodes(supervisor), skew_s=dict(straggler.skew) if straggler else {})


def _nodes(supervisor: Supervisor) -> dict[str, int]:
    fed = supervisor.federation
    if fed is None or not fed.leading:
        return {"joined": 1}
    remotes = list(fed.link.remotes.values())
    lost = sum(1 for r in remotes if r.lost)
    out = {"joined": 1 + len(remotes) - lost, "lost": lost}
    if fed.rdzv.nnodes:
        out["expected"] = int(fed.rdzv.nnodes)
    return out
