"""How ``nccl-doctor check`` says its findings: a line per finding as linters print them
(``path:line:col: CODE message``), or JSON. Renders only."""

from __future__ import annotations

import json
from typing import Any

from nccl_doctor import paths
from nccl_doctor._version import __version__
from nccl_doctor.check.engine import CheckReport
from nccl_doctor.check.rules import RULES
from nccl_doctor.reporters.layout import spans

FORMATS = ("console", "json", "sarif")  # (nccl_doctor.check.FORMATS says the same)


#: the indent of a finding's continued lines on a terminal
INDENT = "    "


def console(report: CheckReport, width: int | None = None) -> str:
    """A line per finding, ``path:line:col: CODE message``; with a ``width`` (a terminal's,
    reporters/layout.py ``width_of``) the message goes on over indented lines that fit it, and
    the fix follows, indented (a pipe or a file: one line each, as editors and CI read them)."""
    out = []
    for f in report.findings:
        head = f"{paths.short_path(f.path)}:{f.line}:{f.col}: {f.code} "
        if width is None:
            out.append(head + f.message() + "\n")
            continue
        out += _wrapped(head, f.message(), width)
        out += _wrapped(INDENT + "fix: ", f.fix or f.rule.fix, width)
    return "".join(out)


def _wrapped(head: str, text: str, width: int) -> list[str]:
    """``head`` then ``text`` laid out to ``width``, its continued lines indented (``head``
    alone on its line when it takes more than half of it)."""
    rest = width - len(INDENT)
    if len(head) > width // 2:
        return [head.rstrip() + "\n"] + [INDENT + text[a:b] + "\n"
                                         for a, b in spans(text, rest, phrases=True)]
    return [(head if k == 0 else INDENT) + text[a:b] + "\n" for k, (a, b) in
            enumerate(spans(text, width - len(head), rest, phrases=True))]


def summary(report: CheckReport) -> str:
    n, files = len(report.findings), report.files
    said = f"{n} finding{'s' if n != 1 else ''}" if n else "no finding"
    return f"nccl-doctor check: {said} in {files} file{'s' if files != 1 else ''}"


def as_json(report: CheckReport) -> str:
    data: dict[str, Any] = {
        "findings": [dict(f.to_json(), path=paths.short_path(f.path)) for f in report.findings],
        "files": report.files, "problems": list(report.problems)}
    return json.dumps(data, indent=2) + "\n"


def as_sarif(report: CheckReport) -> str:
    """SARIF 2.1.0 (what GitHub code scanning reads): one run, the rules, a result per finding
    with the condition as its related location; files that could not be read as notifications."""
    codes = sorted(RULES)
    rules = [{"id": code, "name": code, "shortDescription": {"text": RULES[code].title},
              "help": {"text": RULES[code].fix}} for code in codes]
    results = []
    for f in report.findings:
        uri = paths.short_path(f.path)
        results.append({
            "ruleId": f.code, "ruleIndex": codes.index(f.code), "level": "error",
            "message": {"text": f.message()},
            "locations": [{"physicalLocation": {
                "artifactLocation": {"uri": uri},
                "region": {"startLine": f.line, "startColumn": f.col}}}],
            "relatedLocations": [{"id": 1, "message": {"text": "the rank-dependent condition"},
                                  "physicalLocation": {
                                      "artifactLocation": {"uri": uri},
                                      "region": {"startLine": f.condition_line}}}],
        })
    log = {
        "$schema": "https://json.schemastore.org/sarif-2.1.0.json", "version": "2.1.0",
        "runs": [{
            "tool": {"driver": {"name": "nccl-doctor check", "version": __version__,
                                "rules": rules}},
            "invocations": [{"executionSuccessful": True, "toolExecutionNotifications": [
                {"level": "warning", "message": {"text": p}} for p in report.problems]}],
            "results": results,
        }],
    }
    return json.dumps(log, indent=2) + "\n"
