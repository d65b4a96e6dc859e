"""Helpers shared by commands that write or print a diagnosis."""

from __future__ import annotations

import importlib
import sys
import threading
from pathlib import Path
from typing import TYPE_CHECKING, TextIO, cast

from nccl_doctor.diagnosis import Verdict
from nccl_doctor.cli.pipes import Guarded
from nccl_doctor.errors import ExitStatus, OutputExists, unwritable
from nccl_doctor.files import write_atomic
from nccl_doctor.reporters import format_for, get_reporter

if TYPE_CHECKING:  # the page's drawing (analysis/page_builder.py, Jinja2) is imported when drawn
    from nccl_doctor.diagnosis import Diagnosis
    from nccl_doctor.model import TraceSet


def emit(diagnosis: Diagnosis, output: Path | None, fmt: str | None, force: bool,
         traces: TraceSet | None = None) -> None:
    """Render to ``output`` (refusing to overwrite without --force) or to stdout; ``traces``
    feed the HTML page's drawings."""
    from nccl_doctor.analysis.page_builder import page

    name = format_for(output, fmt)
    reporter = get_reporter(name, page(traces, diagnosis) if name == "html" else None)
    if output is None:
        stdout = cast(TextIO, Guarded(sys.stdout))  # (closed early: OutputClosed, cli/pipes.py)
        reporter.render(diagnosis, stdout, color=sys.stdout.isatty())
        stdout.flush()
        return
    if output.exists() and not force:
        raise OutputExists(f"{output} already exists: pass --force to overwrite it")
    try:
        fh = output.open("w")
    except OSError as err:
        raise unwritable("-o", output, err) from None
    with fh:
        reporter.render(diagnosis, fh)
    sys.stderr.write(f"Wrote {output}\n")


class PageFile:
    """``report.html`` beside report.json: drawn again each time the supervisor writes a report
    (``Supervisor(on_report=...)``), written when the page it makes changed."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._text: str | None = None

    def prepare(self, console: bool = False) -> None:
        """Import what draws the page and load its template (Jinja2 compiles it: tens of
        milliseconds) on a thread of its own while the job starts, so that the first page - at
        the end of a healthy run - does not add that to the run; ``console``: the console
        report's reporter (rich) too. What fails here fails again, and is reported, when the
        page is drawn."""
        threading.Thread(target=_prepare, args=(console,), name="nccl-doctor-page",
                         daemon=True).start()

    @property
    def text(self) -> str:
        """The page as last drawn ("" before the first report)."""
        return self._text or ""

    def __call__(self, diagnosis: Diagnosis, traces: TraceSet | None) -> None:
        from nccl_doctor.analysis.page_builder import page
        from nccl_doctor.reporters import html

        text = html.render(diagnosis, page(traces, diagnosis))
        if text != self._text:
            write_atomic(self.path, text)
            self._text = text


def _prepare(console: bool) -> None:
    try:
        importlib.import_module("nccl_doctor.analysis.page_builder")
        from nccl_doctor.reporters import html

        html._template()
        if console:
            importlib.import_module("nccl_doctor.reporters.console")
    except Exception:  # noqa: BLE001 - drawing the page, or the report, says it
        pass


def verdict_status(diagnosis: Diagnosis | None, status: int, fail_on: str | None) -> int:
    """``status``, unless it is 0, --fail-on suspect was given and the verdict is not ok."""
    if status == 0 and fail_on == "suspect" and diagnosis is not None and \
            diagnosis.verdict is not Verdict.OK:
        return ExitStatus.VERDICT_FAILED
    return status
