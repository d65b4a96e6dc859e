"""report.html: every fixture renders to one self-contained page that parses, names the culprit
rank, its callsite and the fix, fetches nothing, shows job text as text, and stays small for a
1,024-rank job. The timeline pass (analysis/calls/timeline.py) is checked on the same jobs."""

from __future__ import annotations

import io
import re
import tarfile
from pathlib import Path

import html5lib
import pytest

from nccl_doctor.analysis import analyze
from nccl_doctor.analysis.calls.timeline import FOLD_ABOVE, timeline
from nccl_doctor.page_model import rank_ranges
from nccl_doctor.analysis.calls.loaded import load
from nccl_doctor.reporters import format_for, get_reporter
from nccl_doctor.analysis.page_builder import page as page_of
from nccl_doctor.reporters.html import render

FIXTURES = Path(__file__).parents[1] / "fixtures"
INJECTED = "/job/<script>alert(1)</script>.py"


def page(path: Path) -> tuple[str, object, object]:
    traces = load(path)
    diagnosis = analyze(traces)
    text = render(diagnosis, page_of(traces, diagnosis))
    return text, diagnosis, html5lib.parse(text, namespaceHTMLElements=False)


SVG = "{http://www.w3.org/2000/svg}"


def svgs(tree) -> list:
    return list(tree.iter(f"{SVG}svg"))


def text_of(tree) -> str:
    return " ".join(" ".join(el.itertext()) for el in tree.iter("body"))


def assert_self_contained(text: str, tree) -> None:
    for el in tree.iter():
        for attr in ("src", "href", "xlink:href", "action"):
            value = el.get(attr)
            assert value is None or not re.match(r"\s*(https?:)?//", value), (el.tag, value)
    assert "<script" not in text.lower() and "@import" not in text and "url(" not in text


def _h100_runs(tmp: Path) -> list[Path]:
    with tarfile.open(FIXTURES / "gpu" / "h100" / "captures.tar.gz") as tar:
        tar.extractall(tmp, filter="data")
    return sorted(p for p in tmp.iterdir() if p.is_dir() and any(p.glob("*.ndcap")))


def every_fixture(tmp: Path) -> list[Path]:
    frs = sorted(p for p in (FIXTURES / "fr_dumps").iterdir() if p.is_dir())
    with tarfile.open(FIXTURES / "h100_nccl_shape_mismatch_report.tar.gz") as tar:
        tar.extractall(tmp / "report", filter="data")
    return [*frs, *_h100_runs(tmp / "h100"), *sorted((tmp / "report").iterdir())]


def test_every_fixture_renders_a_page_that_names_the_culprit_and_the_fix(tmp_path):
    fixtures = every_fixture(tmp_path)
    assert len(fixtures) >= 12
    for path in fixtures:
        text, diagnosis, tree = page(path)
        assert_self_contained(text, tree)
        for other in ("console", "json"):  # and the other reporters, on the same fixture
            out = io.StringIO()
            get_reporter(other).render(diagnosis, out)
            assert diagnosis.verdict.value in out.getvalue().lower(), (path, other)
        body = text_of(tree)
        assert f"nccl-doctor report {diagnosis.verdict.value}" in " ".join(body.split()), path
        root = diagnosis.root_cause
        if root is None:
            continue
        assert root.title in body and root.hint in body, path
        if root.callsite:
            assert root.callsite in body, path
        culprits = tree.findall(".//tr[@class='culprit']")
        assert sorted(int(tr.find("td").text) for tr in culprits) == sorted(
            r for r in root.ranks if any(s.rank == r for s in diagnosis.ranks)), path


def test_a_hang_on_a_real_h100_draws_its_gpus_with_the_spin_shaded(tmp_path):
    run = tmp_path / "h100" / "nccl_shape_mismatch.report"
    _h100_runs(tmp_path / "h100")
    text, diagnosis, tree = page(run)
    assert any(f.kind.value == "gpu_busy_hang" for f in diagnosis.findings)
    charts = [svg for svg in svgs(tree) if svg.get("class") == "chart"]
    assert charts and all(len(svg.findall(f"{SVG}polyline")) == 2 for svg in charts)
    assert any(r.get("class") == "shade" for svg in charts for r in svg.iter(f"{SVG}rect"))


def test_job_text_is_text_never_markup(tmp_path, write_desync):
    text, diagnosis, tree = page(write_desync(tmp_path, 2, culprit=1, site=INJECTED))
    assert diagnosis.root_cause is not None and INJECTED in diagnosis.root_cause.detail + \
        str(diagnosis.root_cause.callsite)
    assert "<script>alert(1)</script>" not in text
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in text
    assert not list(tree.iter("script")) and not list(tree.iter(f"{SVG}script"))
    assert INJECTED in text_of(tree)  # shown as written


def test_a_1024_rank_desync_folds_to_a_small_page_that_names_its_culprit(tmp_path, write_desync):
    text, diagnosis, tree = page(write_desync(tmp_path, 1024, culprit=637))
    size = len(text.encode())
    assert size < 2_000_000, size
    assert diagnosis.root_cause is not None and diagnosis.root_cause.ranks == (637,)
    assert "ranks 0-636, 638-1023: all_reduce" in diagnosis.root_cause.title
    # every rank was left inside the mismatched call: their ends are its consequences
    assert len(diagnosis.root_cause.evidence["consequences"]) == 1024
    svg = next(s for s in svgs(tree) if s.get("aria-label", "").startswith("collective"))
    titles = [t.find(f"{SVG}title").text for t in svg.iter(f"{SVG}text")
              if t.find(f"{SVG}title") is not None]
    assert len(titles) <= 4, titles  # the 1,023 alike in one row, the culprit in its own
    assert "ranks 637" in titles and "ranks 0-636,638-1023" in titles, titles
    assert_self_contained(text, tree)


def test_the_timeline_marks_the_odd_call_and_folds_only_past_16_ranks(tmp_path, write_desync):
    small = load(write_desync(tmp_path, FOLD_ABOVE, culprit=3))
    d = analyze(small)
    lane = timeline(small, d).lanes[0]
    assert [row.ranks for row in lane.rows] == [(r,) for r in range(FOLD_ABOVE)]
    assert lane.divergence == 12 and lane.seqs[-1] == 12
    last = {row.ranks[0]: row.cells[-1] for row in lane.rows}
    assert last[3].op == "all_gather" and last[3].odd and last[3].state == "entered"
    assert not any(c.odd for r, c in last.items() if r != 3)
    assert [row.culprit for row in lane.rows].count(True) == 1
    big = load(write_desync(tmp_path, FOLD_ABOVE + 1, culprit=3))
    rows = timeline(big, analyze(big)).lanes[0].rows
    assert sorted(r.ranks for r in rows) == [tuple(x for x in range(FOLD_ABOVE + 1) if x != 3),
                                             (3,)]


def test_two_ranks_that_differ_are_both_marked(tmp_path, write_desync):
    """No majority between two ranks: both sides are drawn as differing (the finding names
    rank 1 only by convention)."""
    traces = load(write_desync(tmp_path, 2, culprit=1))
    rows = timeline(traces, analyze(traces)).lanes[0].rows
    assert [(r.cells[-1].op, r.cells[-1].odd) for r in rows] == [("all_reduce", True),
                                                                 ("all_gather", True)]
    assert not any(c.odd for r in rows for c in r.cells[:-1])


@pytest.mark.parametrize("name, fmt_", [("r.html", "html"), ("r.HTM", "html"),
                                        ("r.json", "json"), ("r.txt", "console")])
def test_the_output_name_picks_the_format(name, fmt_):
    assert format_for(Path(name), None) == fmt_
    assert type(get_reporter(fmt_)).__name__.lower().startswith(fmt_)


def test_ranks_in_findings_read_as_ranges():
    from nccl_doctor.analysis.calls.wording import ranks_text

    assert ranks_text([*range(637), *range(638, 1024)]) == "ranks 0-636, 638-1023"
    assert ranks_text([0, 1, 3]) == "ranks 0, 1, 3" and ranks_text([4, 0, 1, 2]) == "ranks 0-2, 4"
    assert ranks_text([1, 2, 3]) == "ranks 1-3" and ranks_text([7]) == "rank 7"


def test_rank_ranges():
    assert rank_ranges((5, 0, 1, 2, 3, 8, 9)) == "0-3,5,8-9"
    assert rank_ranges((7,)) == "7"


def test_a_straggler_draws_its_skew_over_time_in_red(tb):
    traces = []
    for r in range(3):  # rank 2 arrives 150 ms late at 8 of 8 collectives
        events = [tb.event(i, t_enter_ns=tb.T0 + i * 10**9 + (150_000_000 if r == 2 else 0),
                           group_size=3) for i in range(1, 9)]
        traces.append(tb.trace(r, events, tb.clean(), world_size=3))
    ts = tb.traceset(traces)
    d = analyze(ts)
    assert [f.kind.value for f in d.findings] == ["straggler"]
    tree = html5lib.parse(render(d, page_of(ts, d)), namespaceHTMLElements=False)
    chart = next(s for s in svgs(tree) if s.get("aria-label") == "arrival skew over time")
    dots = list(chart.iter(f"{SVG}circle"))
    assert len(dots) == 8 and all(c.get("class") == "late" for c in dots)
    assert {c.find(f"{SVG}title").text for c in dots} == {"150 ms, rank 2 last"}
