"""``report.html``: one self-contained page - no script, font or image fetched from anywhere, so it
opens from a file:// URL, attached to a ticket or a CI artifact. Rendered with Jinja2 (autoescape
on: every string from the job - callsites, exception text, the command - is text, never markup)
from the diagnosis and the ``Page`` the analysis drew from the captures (nccl_doctor/analysis/
page.py: the timeline, the GPU samples). The drawings are inline SVG laid out here; the page has no JavaScript.

``fragment`` is the same report as one element of another page - what a Jupyter notebook shows
for a ``Diagnosis`` (its ``_repr_html_``): the page's content (templates/report_body.html.j2,
one template for both) in a ``<div>``, with the page's stylesheet scoped to that element, so
that it styles the report and nothing else of the notebook."""

from __future__ import annotations

import functools
import json
import re
from pathlib import Path
from typing import Any, TextIO

import jinja2

from nccl_doctor._version import __version__
from nccl_doctor.diagnosis import Diagnosis, Finding, FindingKind
from nccl_doctor.finding_evidence import Evidence, GpuBusyEvidence
from nccl_doctor.gpu.readings import GpuTrace
from nccl_doctor.page_model import Page, Timeline, rank_ranges
from nccl_doctor.reporters.callpath import path_lines
from nccl_doctor.reporters.escape import visible
from nccl_doctor.reporters.templating import environment

_TEMPLATES = Path(__file__).parent / "templates"
#: Points per GPU series drawn (a days-long run is sampled down to this).
MAX_POINTS = 400
#: The class of the fragment's element, the scope of its stylesheet.
FRAGMENT_CLASS = "nccl-doctor-report"


class HtmlReporter:
    """``report.html`` (``--format html``, or ``-o`` a file ending in .html)."""

    def __init__(self, page: Page | None = None) -> None:
        self.page = page or Page()

    def render(self, diagnosis: Diagnosis, stream: TextIO, *, color: bool = False) -> None:
        stream.write(render(diagnosis, self.page))


@functools.lru_cache(maxsize=1)
def _template() -> tuple[jinja2.Template, str]:
    """The page's template and stylesheet, loaded once per process (a run renders the page on a
    hang and again at the end)."""
    env = environment(_TEMPLATES)
    env.filters["visible"] = visible
    env.filters["ranges"] = rank_ranges
    env.filters["path_lines"] = path_lines
    return env.get_template("report.html.j2"), (_TEMPLATES / "report.css").read_text()


@functools.lru_cache(maxsize=1)
def _fragment_template() -> tuple[jinja2.Template, str]:
    """The fragment's template and its scoped stylesheet, loaded once per process."""
    template, css = _template()
    return template.environment.get_template("report_fragment.html.j2"), scoped(
        css, f".{FRAGMENT_CLASS}")


def render(diagnosis: Diagnosis, page: Page) -> str:
    """``report.html``: the whole page."""
    template, css = _template()
    return _render(template, css, diagnosis, page, whole=True)


def fragment(diagnosis: Diagnosis, page: Page | None = None) -> str:
    """The report as one ``<div>`` of another page (a notebook's output), its stylesheet
    scoped to it; ``page``: what it draws beyond the diagnosis (None: the diagnosis alone)."""
    template, css = _fragment_template()
    return _render(template, css, diagnosis, page or Page(), whole=False)


def finding_fragment(finding: Finding) -> str:
    """One finding as the report shows it, alone in a ``<div>`` of another page (a notebook's
    output), with the report's scoped stylesheet."""
    template, css = _fragment_template()
    return template.render(one=finding, evidence=[_evidence_rows(finding.evidence)], css=css)


def scoped(css: str, root: str) -> str:
    """``css`` (report.css: plain rules, no at-rules) applying only inside the element
    ``root`` selects: each selector prefixed with it, the page's ``body`` and ``main`` made
    ``root`` itself."""
    def rule(m: re.Match[str]) -> str:
        space, selectors, block = m.groups()
        return space + ", ".join(root if s in ("body", "main") else f"{root} {s}"
                                 for s in map(str.strip, selectors.split(","))) + block

    return re.sub(r"(\s*)([^{}]+?)(\s*\{[^{}]*\})", rule, css)


def _render(template: jinja2.Template, css: str, diagnosis: Diagnosis, page: Page,
            whole: bool) -> str:
    return template.render(
        whole=whole, one=None, d=diagnosis, root=diagnosis.root_cause, lanes=_lanes(page.timeline),
        tree=page.tree, gpus=_gpu_charts(page.gpu, diagnosis),
        skews=_skew_chart(page.skews, diagnosis), versions=page.versions,
        gpu_reason=page.gpu.reason if page.gpu is not None and not page.gpu.available
        else "",
        evidence=[_evidence_rows(f.evidence) for f in diagnosis.findings],
        css=css, version=__version__,
    )


# -- layout of the drawings (geometry only; what to draw came from the analysis) ------------------

CELL_W, CELL_H, LABEL_W, HEAD_H = 16, 16, 96, 22


def _lanes(timeline: Timeline | None) -> list[dict[str, Any]]:
    if timeline is None:
        return []
    lanes = []
    for lane in timeline.lanes:
        width = LABEL_W + CELL_W * len(lane.seqs) + 8
        height = HEAD_H + CELL_H * len(lane.rows) + 4
        cols = [{"x": LABEL_W + i * CELL_W, "seq": s, "focus": s == lane.divergence,
                 "label": (i % 4 == 0) or s == lane.divergence} for i, s in enumerate(lane.seqs)]
        rows = []
        for j, row in enumerate(lane.rows):
            y = HEAD_H + j * CELL_H
            label = (f"rank {row.ranks[0]}" if len(row.ranks) == 1 else
                     f"{len(row.ranks)} ranks")
            cells = [{"x": cols[i]["x"], "y": y, "cell": c} for i, c in enumerate(row.cells)]
            rows.append({"y": y, "label": label, "ranks": rank_ranges(row.ranks), "row": row,
                         "cells": cells})
        lanes.append({"lane": lane, "width": width, "height": height, "cols": cols,
                      "rows": rows})
    return lanes


CHART_W, CHART_H = 560, 90


def _gpu_charts(gpu: GpuTrace | None, diagnosis: Diagnosis) -> list[dict[str, Any]]:
    if gpu is None or not gpu.available or not gpu.samples:
        return []
    t0 = min(s.t for s in gpu.samples)
    t1 = max(s.t for s in gpu.samples)
    span = max(t1 - t0, 1e-6)
    spins = _spin_windows(diagnosis)
    charts = []
    for index in sorted({s.index for s in gpu.samples}):
        series = gpu.series(index)
        step = max(1, len(series) // MAX_POINTS)
        series = series[::step]
        device = gpu.devices.get(index)
        limit = device.power_limit_w if device is not None and device.power_limit_w else None
        top = limit or max((s.power_w or 0.0 for s in series), default=0.0) or 1.0

        def x(t: float) -> float:
            return round((t - t0) / span * CHART_W, 1)

        def points(values: list[tuple[float, float | None]], full: float) -> str:
            return " ".join(f"{x(t)},{round(CHART_H - min(v, full) / full * CHART_H, 1)}"
                            for t, v in values if v is not None)

        shade = [{"x": x(max(t0, since)), "w": round(max(2.0, x(min(t1, since + secs)) - x(max(t0, since))), 1)}
                 for since, secs in spins.get(index, ())]
        ranks = sorted(r for r, placed in gpu.ranks.items() if placed.index == index)
        charts.append({
            "index": index, "name": device.name if device is not None else "",
            "ranks": rank_ranges(tuple(ranks)) if ranks else "",
            "util": points([(s.t, s.util) for s in series], 100.0),
            "power": points([(s.t, s.power_w) for s in series], top),
            "power_top": round(top), "span_s": round(span, 1), "shade": shade,
            "w": CHART_W, "h": CHART_H,
        })
    return charts


def _skew_chart(skews: tuple[tuple[float, float, int], ...],
                diagnosis: Diagnosis) -> dict[str, Any] | None:
    """Each compared collective as a dot: x its time, y its arrival skew; the straggler's red."""
    if not skews:
        return None
    culprits = {r for f in diagnosis.findings if f.kind is FindingKind.STRAGGLER for r in f.ranks}
    step = max(1, len(skews) // (MAX_POINTS * 2))
    shown = skews[::step]
    t0, t1 = shown[0][0], shown[-1][0]
    span = max(t1 - t0, 1e-6)
    top = max(ms for _, ms, _ in shown) or 1.0
    dots = [{"x": round((t - t0) / span * CHART_W, 1),
             "y": round(CHART_H - ms / top * (CHART_H - 4), 1), "late": late in culprits,
             "what": f"{ms:.0f} ms, rank {late} last"} for t, ms, late in shown]
    return {"dots": dots, "top_ms": round(top), "span_s": round(span, 1), "w": CHART_W,
            "h": CHART_H, "culprits": rank_ranges(tuple(sorted(culprits)))}


def _spin_windows(diagnosis: Diagnosis) -> dict[int, list[tuple[float, float]]]:
    """GPU index -> (since, seconds) of each spin the gpu_busy_hang finding names."""
    out: dict[int, list[tuple[float, float]]] = {}
    for f in diagnosis.findings:
        if f.kind is not FindingKind.GPU_BUSY_HANG:
            continue
        if not isinstance(f.evidence, GpuBusyEvidence):
            continue
        for spin in f.evidence.spinning.values():
            if isinstance(spin.since, (int, float)) and isinstance(spin.span_s, (int, float)):
                out.setdefault(spin.gpu, []).append((float(spin.since), float(spin.span_s)))
    return out


def _evidence_rows(evidence: Evidence) -> list[tuple[str, str]]:
    """A finding's evidence as (key, value) lines, as report.json holds it: scalars as they
    are, the rest as compact JSON (bounded: evidence of a 1,024-rank job must not make the page
    huge)."""
    rows = []
    for key, value in evidence.to_json().items():
        text = value if isinstance(value, str) else json.dumps(value, default=str,
                                                              separators=(", ", ": "))
        rows.append((str(key), text if len(text) <= 2000 else text[:1997] + "..."))
    return rows
