"""The diagnosis on a terminal (rich): the verdict, each finding with its call path and fix, the
ranks, the stack classes.

Laid out to the terminal's width (``COLUMNS`` first, as rich reads it; reporters/layout.py): a
line ends between words, never inside a ``path:line``, a headline between its phrases, and the
ranks' table keeps one row per rank, the columns that do not fit going on a line below it. On a
pipe or a file (no terminal, no ``COLUMNS``) no line is wrapped: each says its whole in one line.
"""

from __future__ import annotations

from typing import TextIO

from rich.cells import cell_len
from rich.console import Console
from rich.markup import escape
from rich.text import Text

from nccl_doctor.diagnosis import Diagnosis, Finding, RankSummary, Severity, Verdict
from nccl_doctor.reporters import layout
from nccl_doctor.reporters.callpath import path_lines
from nccl_doctor.reporters.escape import visible
from nccl_doctor.sections import Ray
from nccl_doctor.words import conjugate, ranks_text

_VERDICT_STYLE = {
    Verdict.OK: "bold green", Verdict.SUSPECT: "bold yellow", Verdict.HANG: "bold red",
    Verdict.CRASH: "bold red", Verdict.UNFINISHED: "bold yellow",
    Verdict.NOT_RECORDED: "bold yellow", Verdict.INTERRUPTED: "bold yellow",
}
_VERDICT_WORDS = {
    Verdict.OK: "no problem found",
    Verdict.SUSPECT: "the job ran, but something is wrong",
    Verdict.HANG: "the job is hung",
    Verdict.CRASH: "the job failed",
    Verdict.UNFINISHED: "the job's end is not recorded (see the first note): its state so far",
    Verdict.NOT_RECORDED: "no rank was recorded: nothing is known about the job (see the note)",
    Verdict.INTERRUPTED: "a signal from outside ended the job before it finished (see the "
                         "first note)",
}
#: the ranks' table: each column's header and, when it goes below the row, its label there
_COLUMNS = (("rank", ""), ("host", ""), ("pid", ""), ("state", ""),
            ("last collective", "last"), ("where", "where"),
            ("stack (innermost user frame)", "stack"))
_HANG = 2  # a wrapped line's next lines are indented this much more than its first
_NO_WIDTH = 1 << 16  # the Console's width when no line is wrapped (it needs one)


class ConsoleReporter:
    """A human summary: verdict, root cause with its fix, other findings, then the ranks.

    ``width``: the columns to lay out for; None: the terminal's (``layout.width_of``), no
    wrapping on a pipe or a file."""

    def __init__(self, width: int | None = None) -> None:
        self.width = width

    def render(self, diagnosis: Diagnosis, stream: TextIO, *, color: bool = False) -> None:
        width = layout.width_of(stream) if self.width is None else max(self.width,
                                                                        layout.MIN_WIDTH)
        console = Console(file=stream, force_terminal=color, no_color=not color,
                          width=width or _NO_WIDTH, highlight=False, soft_wrap=True, emoji=False,
                          legacy_windows=False)
        _Page(console, width).diagnosis(diagnosis)


class _Page:
    """One rendering: lines printed to ``console``, each fitted to ``width`` (None: not wrapped)."""

    def __init__(self, console: Console, width: int | None) -> None:
        self.console, self.width = console, width

    def say(self, markup: str, indent: int = 0, *, phrases: bool = False) -> None:
        """``markup`` as one paragraph at ``indent``, wrapped between words (between phrases,
        ``phrases``: a headline); its next lines indented ``_HANG`` more."""
        text = Text.from_markup(markup, emoji=False)
        room = None if self.width is None else self.width - indent
        rest = None if room is None else room - _HANG
        for n, (start, end) in enumerate(layout.spans(text.plain, room, rest, phrases=phrases)):
            pad = indent if n == 0 else indent + _HANG
            self.console.print(Text(" " * pad) + text[start:end])

    def diagnosis(self, d: Diagnosis) -> None:
        style = _VERDICT_STYLE[d.verdict]
        status = "" if d.exit_status is None else f", exit status {_text(d.exit_status)}"
        self.say(f"[{style}]nccl-doctor: {d.verdict.value.upper()}[/] - "
                 f"{_VERDICT_WORDS[d.verdict]} "
                 f"({_text(d.world_size)} rank{'s' if d.world_size != 1 else ''}{status})"
                 + (f" - partial: {_text(d.partial)}" if d.partial else ""), phrases=True)
        for f in d.findings:
            self.finding(f)
        if d.ranks:
            self.console.print()
            self.ranks(d.ranks)
        if d.ray is not None:
            self.ray(d.ray)
        if d.attempts:
            self.console.print()
            self.say("[bold]attempts[/] (the job's launches, its launcher restarting it)",
                     phrases=True)
            for a in d.attempts:
                self.say(f"{_text(a.label)}: {_text(a.verdict.upper())} - {_text(a.summary)}", 4,
                         phrases=True)
        if d.stack_classes:
            self.console.print()
            self.say("[bold]stacks[/] (the threads making the collectives, ranks with the same "
                     "stack together)", phrases=True)
            for c in d.stack_classes:
                odd = "  [yellow]<- odd one out[/]" if c.odd else ""
                self.say(f"{_text(ranks_text(c.ranks))}: {_text(c.shown)} "
                         f"[dim]({_text(', '.join(c.sources))})[/]{odd}", 4, phrases=True)
        if d.watchdog:
            w = d.watchdog
            self.say(f"[dim]watchdog: {_text(w.situation)} diagnosed {_text(w.waited_s)} s after "
                     f"the last progress; {_text(w.action)}[/]", phrases=True)
        for note in d.notes:
            self.say(f"[yellow]note:[/] {_text(note)}")

    def finding(self, f: Finding) -> None:
        label = "ROOT CAUSE" if f.root_cause else f.severity.value
        style = "bold red" if f.root_cause else "yellow"
        self.console.print()
        self.say(f"[{style}]{label}[/] [bold]{f.kind.value}[/]: {_text(f.title)}", phrases=True)
        # escaped before the split: splitlines() would also cut at \r, \x0b, \x1c... and hide them
        for line in visible(f.detail, newlines=True).split("\n"):
            self.say(_text(line), 4)
        if f.callsite:
            entry = f" [dim](from[/] {_text(f.entry_callsite)}[dim])[/]" if f.entry_callsite else ""
            self.say(f"[dim]callsite:[/] {_text(f.callsite)}{entry}", 4)
        if f.branch_line:
            self.say(f"[bold]branch:[/] {_text(f.branch_line)}", 4)
        lines = path_lines(f.call_path)
        if lines:
            self.say("[dim]call path:[/]", 4)
            for line in lines:
                self.say(_text(line), 6, phrases=True)
        known = f.evidence.known_issue
        if known is not None:
            where = known.upstream or "no upstream library matched: the general fix"
            self.say(f"[magenta]known issue[/] (docs/bugs.md {_text(known.rule)}"
                     f", {_text(known.mechanism)}): {_text(where)}", 4)
        if f.hint and (f.root_cause or f.severity is Severity.WARNING):
            self.say(f"[green]fix:[/] {_text(f.hint)}", 4)

    def ray(self, ray: Ray) -> None:
        """Which Ray actor holds each rank, and the groups between them."""
        self.console.print()
        self.say("[bold]Ray actors[/] " + _text("; ".join(
            f"{ranks_text(ranks)}: {who}" for who, ranks in ray.held().items())), phrases=True)
        for name, g in ray.groups.items():
            self.say(f"group {_text(name)}: {_text(g.role)}", 4)

    def ranks(self, ranks: tuple[RankSummary, ...]) -> None:
        """One row per rank, its state in a word; the columns that do not fit the width on a line
        below the row; then how the ranks ended, the ranks that ended alike together."""
        columns = _COLUMNS if any(r.stack_summary for r in ranks) else _COLUMNS[:-1]
        rows = [_cells(r)[:len(columns)] for r in ranks]
        widths = [max(cell_len(c) for c in [head, *(row[i] for row in rows)])
                  for i, (head, _) in enumerate(columns)]
        shown = layout.fitting_columns(widths, self.width)
        self.console.print(Text(_row([h for h, _ in columns][:shown], widths), style="bold"))
        for row in rows:
            self.console.print(Text(_row(row[:shown], widths)))
            below = [f"{label}: {value}" for (_, label), value
                     in zip(columns[shown:], row[shown:]) if value != "-"]
            together = "; ".join(below)
            if self.width is None or cell_len(together) <= self.width - 4:
                below = [together] if below else []
            for line in below:  # (each on its own line when they do not fit on one)
                self.say(escape(line), 4, phrases=True)
        ended: dict[str, list[int]] = {}
        for r in ranks:
            if r.exit_detail:
                ended.setdefault(r.exit_detail, []).append(r.rank)
        for detail, alike in ended.items():
            self.say(_text(f"{ranks_text(alike)}: {conjugate(alike, detail)}"))


def _cells(r: RankSummary) -> list[str]:
    """A rank's cells, as plain text shown as is (control characters written out)."""
    last = r.last_collective
    return [_plain(v) for v in (r.rank, r.host or "-", r.pid or "-", r.state.replace("_", " "),
                                last.text if last is not None else "-",
                                last.callsite if last is not None and last.callsite else "-",
                                r.stack_summary or "-")]


def _row(cells: list[str], widths: list[int]) -> str:
    """Cells padded to their columns, two spaces apart, no space after the last."""
    return "  ".join(c + " " * (w - cell_len(c)) for c, w in zip(cells, widths)).rstrip()


def _plain(value: object) -> str:
    return visible(str(value)).replace("\t", " ")


def _text(value: object) -> str:
    """Job-provided text as plain words: no control character reaches the terminal and no rich
    markup in it (``[bold]``) is interpreted."""
    return escape(_plain(value))
