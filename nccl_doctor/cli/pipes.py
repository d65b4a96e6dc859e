"""A closed output ends a command quietly, as Unix tools do: ``nccl-doctor replay DIR | head -1``
exits ``ExitStatus.CLOSED_PIPE`` (141, 128 + SIGPIPE: what a shell reports for ``yes | head``)
with nothing on stderr. ``run`` is the exception: the job it watches is never harmed by a closed
terminal, so a run whose stderr's reader went away writes nothing more there, keeps its files
(report.json, report.html) and exits with the job's own status.

Python ignores SIGPIPE, so writing to a pipe whose reader exited raises ``BrokenPipeError``. The
streams are wrapped (``Guarded``), not the writers: rich, for one, catches ``BrokenPipeError`` and
exits 1 by itself; behind ``Guarded`` it sees ``OutputClosed`` instead, which reaches the CLI's
edge (``closed``).
"""

from __future__ import annotations

import os
import sys
from typing import Any, TextIO

from nccl_doctor.errors import ExitStatus


class OutputClosed(Exception):
    """The reader of an output stream went away (a pipe into ``head``, a closed terminal)."""


class Guarded:
    """``stream`` as it is (its ``isatty``, ``fileno``, encoding…), whose ``write`` and ``flush``
    raise ``OutputClosed`` when its reader went away; ``quiet``: they then do nothing instead,
    from then on (``run``'s stderr)."""

    def __init__(self, stream: TextIO, *, quiet: bool = False) -> None:
        self.stream, self.quiet = stream, quiet
        self.closed_early = False

    def write(self, text: str) -> int:
        if self.closed_early:
            return len(text)
        try:
            return self.stream.write(text)
        except BrokenPipeError:
            return self._closed(len(text))

    def flush(self) -> None:
        if self.closed_early:
            return
        try:
            self.stream.flush()
        except BrokenPipeError:
            self._closed(0)

    def _closed(self, written: int) -> int:
        self.closed_early = True
        _to_devnull(self.stream)  # (the interpreter's own last flush of it stays quiet)
        if not self.quiet:
            raise OutputClosed(getattr(self.stream, "name", "output")) from None
        return written

    def __getattr__(self, name: str) -> Any:
        return getattr(self.stream, name)


def closed() -> int:
    """The CLI's edge, for ``OutputClosed`` or a ``BrokenPipeError`` raised where no stream was
    guarded (argparse's ``--help``): the exit status, with stdout pointed at /dev/null so that
    nothing more is written to the closed pipe."""
    _to_devnull(sys.stdout)
    return ExitStatus.CLOSED_PIPE


def say(line: str) -> None:
    """One line on stderr, unless its reader has gone too."""
    try:
        sys.stderr.write(line)
        sys.stderr.flush()
    except (BrokenPipeError, ValueError):
        _to_devnull(sys.stderr)


def _to_devnull(stream: TextIO) -> None:
    try:
        fd = stream.fileno()
    except (AttributeError, OSError, ValueError):  # no descriptor (a StringIO, a test's capture)
        return
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
    except OSError:
        return
    try:
        os.dup2(devnull, fd)
    except OSError:
        pass
    finally:
        os.close(devnull)
