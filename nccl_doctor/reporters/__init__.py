"""Reporters render a ``Diagnosis``; they compute nothing."""

from __future__ import annotations

from pathlib import Path

from nccl_doctor.errors import UsageError
from nccl_doctor.reporters.base import Reporter
from nccl_doctor.reporters.console import ConsoleReporter
from nccl_doctor.page import Page
from nccl_doctor.reporters.html import HtmlReporter
from nccl_doctor.reporters.json import JsonReporter

REPORTERS: dict[str, type[Reporter]] = {"console": ConsoleReporter, "json": JsonReporter,
                                        "html": HtmlReporter}


def get_reporter(name: str, page: Page | None = None) -> Reporter:
    """The reporter for format ``name``; ``page`` (the timeline, GPU samples: analysis/page.py)
    for the HTML page, which draws more than the diagnosis."""
    if name == "html":
        return HtmlReporter(page)
    try:
        return REPORTERS[name]()
    except KeyError:
        choices = ", ".join(sorted(REPORTERS))
        raise UsageError(f"unknown report format {name!r}: use one of {choices}") from None


def format_for(path: Path | None, requested: str | None) -> str:
    """--format wins; otherwise the output file's extension decides (.json -> json, .html and
    .htm -> html)."""
    if requested:
        return requested
    suffix = path.suffix.lower() if path is not None else ""
    if suffix == ".json":
        return "json"
    if suffix in (".html", ".htm"):
        return "html"
    return "console"


__all__ = ["REPORTERS", "Reporter", "format_for", "get_reporter"]
