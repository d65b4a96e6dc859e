"""Renders the watchdog's ``LiveView``: a one-row status bar (rich) or a plain line. Pure."""

from __future__ import annotations

import io
from typing import TYPE_CHECKING

from nccl_doctor.status_view import COUNTED, LiveView, RankState
from nccl_doctor.reporters.escape import visible

if TYPE_CHECKING:  # rich is imported by the bar that draws with it: a log's plain line needs none
    from rich.text import Text

#: each rank state's colour in the bar
STYLES = {
    RankState.RUNNING: "green", RankState.COMPUTING: "green", RankState.WAITING: "yellow",
    RankState.AWAITED: "magenta", RankState.STOPPED: "bold red", RankState.ENDED: "dim",
}
#: beyond this many ranks the bar shows counts per state instead of one entry per rank
PER_RANK_LIMIT = 8


def clock(seconds: float) -> str:
    seconds = int(seconds)
    h, rest = divmod(seconds, 3600)
    return f"{h}:{rest // 60:02d}:{rest % 60:02d}" if h else f"{rest // 60}:{rest % 60:02d}"


def bar(view: LiveView) -> Text:
    """The status bar's content: ranks with their call counters (``COUNTED``: the calls the
    recorder saw), the phase, the message."""
    from rich.text import Text

    t = Text(" nccl-doctor ", style="bold reverse cyan")
    t.append(f" {clock(view.elapsed_s)} ", style="dim")
    if not view.ranks:
        t.append(" waiting for ranks to record a call")
        return t
    t.append(f" {len(view.ranks)} ranks  {COUNTED}")
    if len(view.ranks) <= PER_RANK_LIMIT:
        for r in view.ranks:
            t.append(f" {r.rank}:", style="dim")
            t.append(str(r.calls), style=STYLES[r.state])
    else:
        counts = [r.calls for r in view.ranks]
        t.append(f" {min(counts)}-{max(counts)} ")
        for state in RankState:
            n = sum(1 for r in view.ranks if r.state is state)
            if n:
                t.append(f" {n} {state.value}", style=STYLES[state])
    t.append("  ")
    t.append(view.phase.replace("_", " "), style="bold red" if view.phase == "hang" else "bold")
    if view.quiet_s >= 1:
        t.append(f" (no new call for {view.quiet_s:.0f} s)", style="dim")
    if view.message:  # (it may quote the job: a callsite, an exception)
        t.append("  " + visible(view.message))
    return t


def ansi(text: Text, width: int) -> str:
    """``text`` as one row of ANSI for a ``width``-column terminal, cut with an ellipsis."""
    from rich.console import Console

    buffer = io.StringIO()
    console = Console(file=buffer, force_terminal=True, color_system="standard", width=width,
                      legacy_windows=False, highlight=False, soft_wrap=False)
    text = text.copy()
    text.truncate(width, overflow="ellipsis")
    console.print(text, end="", no_wrap=True, overflow="ellipsis", crop=True)
    return buffer.getvalue().replace("\n", "")


def line(view: LiveView) -> str:
    """The plain form (logs, pipes): phase, per-rank counters (``COUNTED``) and states,
    message."""
    ranks = " ".join(f"{r.rank}:{r.calls}{'' if r.state is RankState.RUNNING else '/' + r.state.value}"
                     for r in view.ranks[:PER_RANK_LIMIT])
    if len(view.ranks) > PER_RANK_LIMIT:
        ranks += f" (+{len(view.ranks) - PER_RANK_LIMIT} ranks)"
    text = f"[{clock(view.elapsed_s)}] {view.phase.replace('_', ' ')}"
    if ranks:
        text += f"; {COUNTED} {ranks}"
    if view.message:
        text += f"; {visible(view.message)}"
    return text
