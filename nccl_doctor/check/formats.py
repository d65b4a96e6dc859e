"""How ``nccl-doctor check`` says its findings: a line per finding as linters print them
(``path:line:col: CODE message``), or JSON. Renders only."""

from __future__ import annotations

import json
from typing import Any

from nccl_doctor import paths
from nccl_doctor.check.engine import CheckReport

FORMATS = ("console", "json")  # (nccl_doctor.check.FORMATS, for the parser, says the same)


def console(report: CheckReport) -> str:
    lines = [f"{paths.short_path(f.path)}:{f.line}:{f.col}: {f.code} {f.message()}"
             for f in report.findings]
    return "".join(line + "\n" for line in lines)


def summary(report: CheckReport) -> str:
    n, files = len(report.findings), report.files
    said = f"{n} finding{'s' if n != 1 else ''}" if n else "no finding"
    return f"nccl-doctor check: {said} in {files} file{'s' if files != 1 else ''}"


def as_json(report: CheckReport) -> str:
    data: dict[str, Any] = {
        "findings": [dict(f.to_json(), path=paths.short_path(f.path)) for f in report.findings],
        "files": report.files, "problems": list(report.problems)}
    return json.dumps(data, indent=2) + "\n"
