"""``/``: the live page of ``run --serve`` - the job's phase, verdict, root cause and ranks, drawn
on the server from a ``Published`` look with a template shipped in the package
(templates/live.html.j2, Jinja2 with autoescape: every text the job wrote - a host, an
exception, a call site - is escaped) and reloaded by the browser every few seconds, but for the
final look's, which a browser keeps once the run has ended. No script."""

from __future__ import annotations

import functools
import time
from pathlib import Path

import jinja2

from nccl_doctor.serve.state import Published
from nccl_doctor.reporters.templating import environment

REFRESH_S = 2
_TEMPLATES = Path(__file__).parent / "templates"
_COLOURS = {"hang": "#b00020", "crash": "#b00020", "suspect": "#b26a00", "ok": "#1b5e20",
            "unfinished": "#455a64", "not_recorded": "#455a64",
            "interrupted": "#455a64"}


@functools.lru_cache(maxsize=1)
def _template() -> jinja2.Template:
    return environment(_TEMPLATES).get_template("live.html.j2")


def render(pub: Published) -> str:
    """The page of ``pub``."""
    status = pub.status()
    verdict, phase = status["verdict"], status["phase"]
    shown = verdict if verdict != "none" else phase
    colour = _COLOURS.get(verdict) or ("#b00020" if phase == "hang" else "#1565c0")
    return _template().render(  # the final look's page is not reloaded: it outlives the run
        s=status, shown=shown, colour=colour, refresh=0 if pub.final else REFRESH_S,
        full_report=bool(pub.report_html),
        stamp=time.strftime("%H:%M:%S", time.localtime(pub.at)))
