"""Reporters render a ``Diagnosis``; they compute nothing."""

from __future__ import annotations

import importlib
from pathlib import Path
from typing import TYPE_CHECKING

from nccl_doctor.errors import UsageError
from nccl_doctor.reporters.base import Reporter

if TYPE_CHECKING:
    from nccl_doctor.page_model import Page
    from nccl_doctor.reporters.console import ConsoleReporter
    from nccl_doctor.reporters.html import HtmlReporter
    from nccl_doctor.reporters.json import JsonReporter

#: Each format's module and class, imported when first used (rich, Jinja2): ``nccl-doctor run``
#: needs none of them before its job starts. ``REPORTERS`` (format -> class) and the classes
#: are this package's attributes as well (``__getattr__``).
_CLASSES = {"console": ("console", "ConsoleReporter"), "json": ("json", "JsonReporter"),
            "html": ("html", "HtmlReporter")}
FORMATS = tuple(sorted(_CLASSES))


def _class(fmt: str) -> type[Reporter]:
    module, name = _CLASSES[fmt]
    return getattr(importlib.import_module(f"{__name__}.{module}"), name)


def __getattr__(name: str) -> object:
    if name == "REPORTERS":
        return {fmt: _class(fmt) for fmt in _CLASSES}
    for fmt, (_, cls) in _CLASSES.items():
        if cls == name:
            return _class(fmt)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def get_reporter(name: str, page: Page | None = None) -> Reporter:
    """The reporter for format ``name``; ``page`` (the timeline, GPU samples: analysis/page_builder.py)
    for the HTML page, which draws more than the diagnosis."""
    if name == "html":
        from nccl_doctor.reporters.html import HtmlReporter
        return HtmlReporter(page)
    if name not in _CLASSES:
        raise UsageError(f"unknown report format {name!r}: use one of {', '.join(FORMATS)}")
    return _class(name)()


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


__all__ = ["FORMATS", "REPORTERS", "ConsoleReporter", "HtmlReporter", "JsonReporter", "Reporter",
           "format_for", "get_reporter"]
