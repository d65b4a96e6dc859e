"""The diagnosis on a terminal (rich): the verdict, each finding with its call path and fix, the
ranks, the stack classes."""

from __future__ import annotations

from typing import TextIO

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from nccl_doctor.diagnosis import Diagnosis, Finding, Severity, Verdict
from nccl_doctor.reporters.callpath import path_lines
from nccl_doctor.reporters.escape import visible
from nccl_doctor.sections import Ray

_VERDICT_STYLE = {
    Verdict.OK: "bold green", Verdict.SUSPECT: "bold yellow", Verdict.HANG: "bold red",
    Verdict.CRASH: "bold red", Verdict.UNFINISHED: "bold yellow",
    Verdict.NOT_RECORDED: "bold yellow",
}
_VERDICT_WORDS = {
    Verdict.OK: "no problem found",
    Verdict.SUSPECT: "the job ran, but something is wrong",
    Verdict.HANG: "the job is hung",
    Verdict.CRASH: "the job failed",
    Verdict.UNFINISHED: "the job's end is not recorded (see the first note): its state so far",
    Verdict.NOT_RECORDED: "no rank was recorded: nothing is known about the job (see the note)",
}


class ConsoleReporter:
    """A human summary: verdict, root cause with its fix, other findings, then the ranks."""

    def render(self, diagnosis: Diagnosis, stream: TextIO, *, color: bool = False) -> None:
        console = Console(file=stream, force_terminal=color, no_color=not color, width=110,
                          highlight=False, soft_wrap=False)
        d = diagnosis
        style = _VERDICT_STYLE[d.verdict]
        status = "" if d.exit_status is None else f", exit status {_text(d.exit_status)}"
        console.print(
            f"[{style}]nccl-doctor: {d.verdict.value.upper()}[/] - {_VERDICT_WORDS[d.verdict]} "
            f"({_text(d.world_size)} rank{'s' if d.world_size != 1 else ''}{status})"
            + (f" - partial: {_text(d.partial)}" if d.partial else "")
        )
        for f in d.findings:
            self._finding(console, f)
        if d.ranks:
            console.print(self._ranks_table(d))
        if d.ray is not None:
            self._ray(console, d.ray)
        if d.stack_classes:
            console.print("\n[bold]stacks[/] (the threads making the collectives, ranks with the same stack together)")
            for c in d.stack_classes:
                odd = "  [yellow]<- odd one out[/]" if c.odd else ""
                ranks = ", ".join(str(r) for r in c.ranks)
                sources = ", ".join(c.sources)
                console.print(f"    ranks {_text(ranks)}: {_text(c.shown)} "
                              f"[dim]({_text(sources)})[/]{odd}")
        if d.watchdog:
            w = d.watchdog
            console.print(f"[dim]watchdog: {_text(w.situation)} diagnosed "
                          f"{_text(w.waited_s)} s after the last progress; "
                          f"{_text(w.action)}[/]")
        for note in d.notes:
            console.print(f"[yellow]note:[/] {_text(note)}")

    def _finding(self, console: Console, f: Finding) -> None:
        label = "ROOT CAUSE" if f.root_cause else f.severity.value
        style = "bold red" if f.root_cause else "yellow"
        console.print(f"\n[{style}]{label}[/] [bold]{f.kind.value}[/]: {_text(f.title)}")
        # escaped before the split: splitlines() would also cut at \r, \x0b, \x1c... and hide them
        for line in visible(f.detail, newlines=True).split("\n"):
            console.print(f"    {escape(line)}")
        if f.callsite:
            entry = f" [dim](from[/] {_text(f.entry_callsite)}[dim])[/]" if f.entry_callsite else ""
            console.print(f"    [dim]callsite:[/] {_text(f.callsite)}{entry}")
        if f.branch_line:
            console.print(f"    [bold]branch:[/] {_text(f.branch_line)}")
        lines = path_lines(f.call_path)
        if lines:
            console.print("    [dim]call path:[/]")
            for line in lines:
                console.print(f"      {_text(line)}")
        known = f.evidence.known_issue
        if known is not None:
            where = known.upstream or "no upstream library matched: the general fix"
            console.print(f"    [magenta]known issue[/] (docs/bugs.md {_text(known.rule)}"
                          f", {_text(known.mechanism)}): {_text(where)}")
        if f.hint and (f.root_cause or f.severity is Severity.WARNING):
            console.print(f"    [green]fix:[/] {_text(f.hint)}")

    def _ray(self, console: Console, ray: Ray) -> None:
        """Which Ray actor holds each rank, and the groups between them."""
        console.print("\n[bold]Ray actors[/] " + _text("; ".join(
            f"rank {', '.join(map(str, ranks))}: {who}" for who, ranks in ray.held().items())))
        for name, g in ray.groups.items():
            console.print(f"    group {_text(name)}: {_text(g.role)}")

    def _ranks_table(self, d: Diagnosis) -> Table:
        table = Table(title=None, show_edge=False, pad_edge=False, box=None, header_style="bold")
        for col in ("rank", "host", "pid", "state", "last collective"):
            table.add_column(col)
        table.add_column("where", overflow="fold")
        stacks = any(r.stack_summary for r in d.ranks)
        if stacks:
            table.add_column("stack (innermost user frame)", overflow="fold")
        for r in d.ranks:
            last = r.last_collective
            row = [_text(r.rank), _text(r.host or "-"), _text(r.pid or "-"),
                   _text(r.exit_detail if r.state != "running" else r.state),
                   _text(last.text if last is not None else "-"),
                   _text(last.callsite if last is not None else "-")]
            if stacks:
                row.append(_text(r.stack_summary or "-"))
            table.add_row(*row)
        return table


def _text(value: object) -> str:
    """Job-provided text as plain words: no control character reaches the terminal and no rich
    markup in it (``[bold]``) is interpreted."""
    return escape(visible(str(value)))
