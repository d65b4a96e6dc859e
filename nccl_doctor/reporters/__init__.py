"""Reporters render a ``Diagnosis``; they compute nothing."""

from __future__ import annotations

from pathlib import Path

from nccl_doctor.errors import UsageError
from nccl_doctor.reporters.base import Reporter
from nccl_doctor.reporters.console import ConsoleReporter
from nccl_doctor.reporters.json import JsonReporter

REPORTERS: dict[str, type[Reporter]] = {"console": ConsoleReporter, "json": JsonReporter}


def get_reporter(name: str) -> Reporter:
    try:
        return REPORTERS[name]()
    except KeyError:
        choices = ", ".join(sorted(REPORTERS))
        raise UsageError(f"unknown report format {name!r}: use one of {choices}") from None


def format_for(path: Path | None, requested: str | None) -> str:
    """--format wins; otherwise the output file's extension decides (.json -> json)."""
    if requested:
        return requested
    if path is not None and path.suffix.lower() == ".json":
        return "json"
    return "console"


__all__ = ["REPORTERS", "Reporter", "format_for", "get_reporter"]
