"""The live status of ``nccl-doctor run``, on the terminal the job writes to.

On a TTY it is a one-row bar on the terminal's last row, kept out of the job's way with a
scrolling region (DECSTBM, as apt's progress bar does): the job's output scrolls in the rows
above and is never overwritten or interleaved, since every redraw is one write() that saves the
cursor, draws the bottom row and restores the cursor. When not on a TTY (a log file, a pipe) it is
plain: one whole line each time the watchdog's view of the job changes, no escape codes.
"""

from __future__ import annotations

import os
import time
from typing import Callable, Protocol, TextIO

from nccl_doctor.reporters import status_line
from nccl_doctor.reporters.escape import visible
from nccl_doctor.status_view import LiveView

SAVE, RESTORE, CLEAR_ROW = "\0337", "\0338", "\033[2K"
REDRAW_EVERY = 0.5  # seconds between bar redraws while the phase stands (a new one: at once)
MIN_ROWS = 6  # a terminal with fewer rows gets the plain form


class Display(Protocol):
    def __call__(self, _supervisor: object = None) -> None: ...
    def announce(self, message: str) -> None: ...
    def close(self) -> None: ...


def make_display(stream: TextIO, view: Callable[[], LiveView] | None) -> Display:
    """The bar when ``stream`` is a terminal big enough; the plain lines otherwise."""
    if view is not None and _isatty(stream):
        bar = StatusBar(stream, view)
        if bar.open():
            return bar
    return PlainStatus(stream, view)


def _isatty(stream: TextIO) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError):
        return False


def _write(stream: TextIO, text: str) -> None:
    try:
        stream.write(text)
        stream.flush()
    except (OSError, ValueError):  # a closed or broken terminal must not stop the supervisor
        pass


def _one_line(message: str) -> str:
    # an announcement quotes the job (a finding's title: callsites, exception text): its control
    # characters are shown, never sent to the terminal
    return visible(message.replace("\n", " "))


class PlainStatus:
    """One line per change of the job's phase or the watchdog's message."""

    def __init__(self, stream: TextIO, view: Callable[[], LiveView] | None) -> None:
        self.stream, self.view = stream, view
        self._last: tuple[str, str] | None = None

    def __call__(self, _supervisor: object = None) -> None:
        if self.view is None:
            return
        try:
            v = self.view()
        except Exception:
            return
        key = (v.phase, v.message)
        if key == self._last or v.phase == "starting":
            return
        first = self._last is None
        self._last = key
        if first and v.phase == "running" and not v.message:
            return  # the job has started recording: nothing to say yet
        self.announce(status_line.line(v))

    def announce(self, message: str) -> None:
        _write(self.stream, "nccl-doctor: " + _one_line(message) + "\n")

    def close(self) -> None:
        pass


class StatusBar:
    """The bar on the terminal's last row, below a scrolling region that holds the job's output."""

    def __init__(self, stream: TextIO, view: Callable[[], LiveView],
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.stream, self.view, self.clock = stream, view, clock
        self.size: os.terminal_size | None = None
        self._drawn_at = float("-inf")
        self._phase = ""  # the phase last drawn

    def open(self) -> bool:
        size = self._terminal_size()
        if size is None or size.lines < MIN_ROWS:
            return False
        self.size = size
        # make room: scroll one row if the cursor is on the last one, then fence that row off
        _write(self.stream, "\n\033[1A" + self._region(size.lines))
        self._draw(force=True)
        return True

    def _terminal_size(self) -> os.terminal_size | None:
        try:
            return os.get_terminal_size(self.stream.fileno())
        except (OSError, ValueError, AttributeError):
            return None

    @staticmethod
    def _region(rows: int) -> str:
        # DECSTBM moves the cursor home: save and restore it around the change
        return f"{SAVE}\033[1;{rows - 1}r{RESTORE}"

    def __call__(self, _supervisor: object = None) -> None:
        self._draw(force=False)

    def _draw(self, force: bool) -> None:
        try:
            self._draw_now(force)
        except Exception:  # the display is never worth an error in the supervisor
            self.close()

    def _draw_now(self, force: bool) -> None:
        if self.size is None:
            return
        now = self.clock()
        view = self.view()
        # (a phase lasts as little as one look of the supervisor, which sleeps between looks
        # while nothing moves: a deadlock being confirmed is shown when it is seen)
        if not force and now - self._drawn_at < REDRAW_EVERY and view.phase == self._phase:
            return
        self._drawn_at, self._phase = now, view.phase
        size = self._terminal_size() or self.size
        if size.lines < MIN_ROWS:  # too small now: give the terminal back, go quiet
            self.close()
            return
        prefix = ""
        if size != self.size:  # resized: clear the old bar row
            prefix = f"{SAVE}\033[{self.size.lines};1H{CLEAR_ROW}{RESTORE}"
            self.size = size
        row = status_line.ansi(status_line.bar(view), max(size.columns - 1, 10))
        # the region is set again with each draw, in case the job reset it
        _write(self.stream, f"{prefix}{self._region(size.lines)}"
                            f"{SAVE}\033[{size.lines};1H{CLEAR_ROW}{row}{RESTORE}")

    def announce(self, message: str) -> None:
        """An event (a hang, the job stopped): a whole line in the job's scrolling output."""
        _write(self.stream, "\033[1;36mnccl-doctor:\033[0m " + _one_line(message) + "\n")
        if self.size is not None:
            self._draw(force=True)

    def close(self) -> None:
        """Give the terminal back as it was: no region, the bar's row cleared."""
        if self.size is None:
            return
        rows = (self._terminal_size() or self.size).lines
        self.size = None
        _write(self.stream, f"{SAVE}\033[{rows};1H{CLEAR_ROW}\033[r{RESTORE}")
