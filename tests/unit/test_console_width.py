"""The console report fits the width it is given (a terminal's, ``COLUMNS``) and, on a pipe, wraps
nothing: no ``path:line`` is cut across lines, a headline ends between its phrases, a rank keeps
one row; paths print in their short form (installed files from their package root)."""

from __future__ import annotations

import io
import os
from dataclasses import replace

import pytest
from rich.cells import cell_len

from nccl_doctor.analysis import analyze
from nccl_doctor.diagnosis import Diagnosis, RankSummary, Verdict
from nccl_doctor.location import Location
from nccl_doctor.reporters import layout
from nccl_doctor.reporters.console import ConsoleReporter
from nccl_doctor.sections import LastCollective, StackClass
from nccl_doctor.watch_account import WatchAccount

WIDTHS = (60, 80, 120, 200)
#: a place in source code as the reports print it
SITE_PACKAGES = "/opt/venv/lib/python3.11/site-packages/"


@pytest.fixture(autouse=True)
def _no_columns(monkeypatch) -> None:
    """Width None is a pipe's (no line wrapped) whatever ``COLUMNS`` the shell running the tests
    exports."""
    monkeypatch.delenv("COLUMNS", raising=False)


def render(d: Diagnosis, width: int | None) -> str:
    out = io.StringIO()  # not a terminal: no width of its own
    ConsoleReporter(width).render(d, out)
    return out.getvalue()








@pytest.fixture
def library_call(tb, tmp_path, monkeypatch) -> Diagnosis:
    """The padded gather made by a library (TRL's, installed) from the user's train.py in the
    working directory, two ranks on hosts with long names, stacks and the watchdog's account."""
    monkeypatch.chdir(tmp_path)
    path = (Location(SITE_PACKAGES + "accelerate/utils/operations.py", 380, "gather"),
            Location(SITE_PACKAGES + "trl/trainer/cpo_trainer.py", 839, "get_batch_loss_metrics"),
            Location(str(tmp_path / "train.py"), 16, "main"))
    base = tb.scenarios["shape_mismatch"]()
    traces = replace(base, ranks={r: replace(
        t, meta=replace(t.meta, versions={"trl": "0.16.1"}, host=f"gpu-node-{r:03d}.cluster"),
        events=tuple(replace(e, callsite=path[-1], api_callsite=path[0], path=path)
                     for e in t.events)) for r, t in base.ranks.items()})
    d = analyze(traces)
    ranks = tuple(replace(r, stack_summary="train.py:16 in main <- trl/trainer/cpo_trainer.py:839 "
                                           "in get_batch_loss_metrics [py-spy]")
                  for r in d.ranks)
    return replace(d, ranks=ranks, watchdog=WatchAccount(
        situation="deadlock", waited_s=2.0, action="stopped the job"), stack_classes=(
        StackClass(ranks=(0,), odd=True, sources=("py-spy",), frames=(
            "train.py:30 <module>", "train.py:16 main", "trl/trainer/cpo_trainer.py:839 "
            "get_batch_loss_metrics", "accelerate/utils/operations.py:380 gather")),))


@pytest.mark.parametrize("width", WIDTHS)
def test_every_line_fits_and_no_place_is_cut(library_call, width, fit) -> None:
    text = render(library_call, width)
    assert max(cell_len(line) for line in text.splitlines()) <= width, text
    assert fit.sites(text) == fit.sites(render(library_call, None)), text
    assert "trl/trainer/cpo_trainer.py:839" in text and "site-packages" not in text
    assert "train.py:16" in text and os.getcwd() not in text  # the user's file, relative


@pytest.mark.parametrize("width", WIDTHS)
def test_every_scenario_fits_and_keeps_its_places_whole(scenario, width, fit) -> None:
    _label, ts = scenario
    d = analyze(ts)
    text = render(d, width)
    assert max(cell_len(line) for line in text.splitlines()) <= width, text
    assert fit.sites(text) == fit.sites(render(d, None)), text


@pytest.mark.parametrize("width", WIDTHS)
def test_headlines_end_between_phrases(library_call, scenario, width, fit) -> None:
    for d in (library_call, analyze(scenario[1])):
        lines = render(d, width).splitlines()
        verdict = fit.headline(lines, "nccl-doctor: ")
        titles = [(f"{'ROOT CAUSE' if f.root_cause else f.severity.value} {f.kind.value}: ",
                   f.title) for f in d.findings]
        for prefix, title in [("nccl-doctor: ", None), *titles]:
            shown = fit.headline(lines, prefix) if title is not None else verdict
            if title is not None:
                assert " ".join(shown) == prefix + title
            for before, after in zip(shown, shown[1:]):
                assert fit.between_phrases(before, after), shown


@pytest.mark.parametrize("width", WIDTHS)
def test_each_rank_keeps_one_row_and_its_state_in_a_word(library_call, width) -> None:
    lines = render(library_call, width).splitlines()
    header = next(i for i, line in enumerate(lines) if line.startswith("rank  host"))
    for r in library_call.ranks:
        row = next(line for line in lines[header:] if line.startswith(f"{r.rank}  "))
        assert row.split()[1:4] == [r.host, str(r.pid), r.state]
    # how they ended, the ranks alike together, with the verb agreeing
    assert "ranks 0, 1: raised RuntimeError" in " ".join(lines)


def test_columns_that_do_not_fit_go_below_the_row(library_call) -> None:
    whole = render(library_call, None).splitlines()
    assert any(line.startswith("rank  host") and line.endswith("stack (innermost user frame)")
               for line in whole)
    wide = render(library_call, 200).splitlines()  # the long "where" fits, the stack goes below
    assert any(line.startswith("rank  host") and line.endswith("where") for line in wide)
    assert len([line for line in wide if line.startswith("    stack: train.py:16 in main")]) == 2
    narrow = render(library_call, 80).splitlines()
    assert any(line.startswith("rank  host") and line.endswith("last collective")
               for line in narrow)
    # each column below the row on its own line when they do not fit on one together
    assert len([line for line in narrow if line.startswith("    where: trl/trainer/")]) == 2
    assert len([line for line in narrow if line.startswith("    stack: train.py:16 in main")]) == 2


def test_a_pipe_wraps_nothing(library_call) -> None:
    """No width (a pipe, a file): every headline, detail and rank is one whole line."""
    text = render(library_call, None)
    root = library_call.root_cause
    assert f"ROOT CAUSE {root.kind.value}: {root.title}\n" in text
    for line in root.detail.splitlines():
        assert f"    {line}\n" in text
    assert f"    fix: {root.hint}\n" in text


def test_the_width_is_the_terminals_or_columns(monkeypatch) -> None:
    monkeypatch.delenv("COLUMNS", raising=False)
    assert layout.width_of(io.StringIO()) is None  # a pipe, a file: no width

    class Terminal(io.StringIO):
        def isatty(self) -> bool:
            return True

        def fileno(self) -> int:
            return 99

    monkeypatch.setattr(os, "get_terminal_size", lambda fd: os.terminal_size((93, 30)))
    assert layout.width_of(Terminal()) == 93
    monkeypatch.setenv("COLUMNS", "70")  # as rich and the shells read it, a pipe's too
    assert layout.width_of(Terminal()) == 70 and layout.width_of(io.StringIO()) == 70
    monkeypatch.setenv("COLUMNS", "12")
    assert layout.width_of(io.StringIO()) == layout.MIN_WIDTH


def test_the_reporter_lays_out_for_columns_on_a_pipe(library_call, monkeypatch) -> None:
    monkeypatch.setenv("COLUMNS", "80")
    assert render(library_call, None) == render(library_call, 80)
    monkeypatch.delenv("COLUMNS")
    assert max(len(line) for line in render(library_call, None).splitlines()) > 120


@pytest.mark.parametrize(("text", "width", "lines"), [
    # between words, never inside one
    ("at train.py:19 [entered]", 16, ["at train.py:19", "[entered]"]),
    # a word wider than the line stands alone, whole
    ("x a/very/long/path/to/file.py:1 y", 12, ["x", "a/very/long/path/to/file.py:1", "y"]),
    # not inside a list of ranks when the line can end before it
    ("the call ranks 0, 2 made", 17, ["the call", "ranks 0, 2 made"]),
])
def test_lines_end_between_words(text, width, lines) -> None:
    assert [text[a:b] for a, b in layout.spans(text, width)] == lines


def test_a_headline_ends_at_its_strongest_phrase_boundary() -> None:
    title = ("ROOT CAUSE collective_mismatch: all_reduce / broadcast #6 of group 0: ops differ "
             "(ranks 0, 2: broadcast; rank 1: all_reduce)")
    cut = {w: [title[a:b] for a, b in layout.spans(title, w, w - 2, phrases=True)]
           for w in (60, 80, 120)}
    assert cut[60] == ["ROOT CAUSE collective_mismatch:",
                       "all_reduce / broadcast #6 of group 0: ops differ",
                       "(ranks 0, 2: broadcast; rank 1: all_reduce)"]
    assert cut[80] == cut[120] == [
        "ROOT CAUSE collective_mismatch: all_reduce / broadcast #6 of group 0: ops differ",
        "(ranks 0, 2: broadcast; rank 1: all_reduce)"]
    assert layout.spans(title, None) == [(0, len(title))]


def test_fitting_columns() -> None:
    assert layout.fitting_columns([4, 4, 5], None) == 3
    assert layout.fitting_columns([4, 4, 5], 14) == 2 and layout.fitting_columns([4, 4, 5], 17) == 3
    assert layout.fitting_columns([50, 4], 10) == 1  # the first column always


def test_a_rank_with_no_collective_and_odd_text_renders(tb) -> None:
    """A rank's cells from the job are shown as text: markup literal, control characters
    written out; an empty table cell reads "-"."""
    rank = RankSummary(rank=0, host="[bold]h\x1b[2J", pid=0, state="no_capture",
                       exit_code=None, signal=None, exit_detail="left no capture",
                       last_collective=None, stack_summary=None, capture=None)
    other = replace(rank, rank=1, host="h", pid=7, state="running", exit_detail="was running",
                    last_collective=LastCollective("0", 3, "all_reduce", "entered",
                                                   "train.py:9"))
    text = render(Diagnosis(verdict=Verdict.HANG, findings=(), ranks=(rank, other),
                            world_size=2), 80)
    assert "[bold]h\\x1b[2J" in text and "\x1b" not in text
    assert "0     [bold]h\\x1b[2J  -    no capture  -" in text
    assert "rank 0: left no capture" in text and "rank 1: was running" in text
