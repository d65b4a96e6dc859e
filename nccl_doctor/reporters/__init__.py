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


#: The report format each output file extension names (``replay -o FILE``); any other
#: extension names none, and the report is then console text unless ``--format`` says otherwise.
SUFFIXES = {".json": "json", ".html": "html", ".htm": "html", ".txt": "console",
            ".log": "console"}


def format_for(path: Path | None, requested: str | None) -> str:
    """The report format: ``--format``'s, else the one the output file's extension names, else
    console. An extension that names another format than ``--format`` is a ``UsageError``
    (``--format json -o r.html`` would write JSON into a page's name)."""
    named = SUFFIXES.get(path.suffix.lower()) if path is not None else None
    if requested and named and requested != named:
        ends = " or ".join(s for s, f in SUFFIXES.items() if f == requested)
        raise UsageError(f"-o {path}: its extension names the {named} format, not --format "
                         f"{requested}: end the file in {ends}, or leave --format out")
    return requested or named or "console"


__all__ = ["FORMATS", "REPORTERS", "SUFFIXES", "ConsoleReporter", "HtmlReporter", "JsonReporter",
           "Reporter", "format_for", "get_reporter"]
