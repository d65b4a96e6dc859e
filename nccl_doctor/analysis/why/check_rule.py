"""The run points back (issue 51): when a run's root cause is a branch on the rank that
``nccl-doctor check`` finds before the run, the report names the rule.

The branch's file is checked as ``check`` reads it - only when its bytes are still those the
run recorded (the fingerprint a rank took of it): line numbers of an edited file mean nothing."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from nccl_doctor import paths
from nccl_doctor.source.source_text import digest
from nccl_doctor.check.engine import check_paths
from nccl_doctor.check.rules import CheckFinding
from nccl_doctor.diagnosis import Finding
from nccl_doctor.model import TraceSet


def rule_for(f: Finding, traces: TraceSet) -> CheckFinding | None:
    """The ``check`` finding whose condition is ``f``'s culprit branch, if any."""
    b = f.branch
    if b is None or not b.culprit or not b.path:
        return None
    recorded = {t.meta.sources.get(b.path) for t in traces.ranks.values()} - {None}
    path = Path(b.path)
    try:
        if not recorded or digest(path.read_bytes()) not in recorded:
            return None
    except OSError:
        return None
    return next((c for c in check_paths([path]).findings if c.condition_line == b.line), None)


def with_rule(findings: list[Finding], traces: TraceSet) -> list[Finding]:
    """The root cause, with the rule ``check`` finds it by (a line of its detail and
    ``evidence.check_rule``)."""
    out = []
    for f in findings:
        found = rule_for(f, traces) if f.root_cause else None
        if found is None:
            out.append(f)
            continue
        where = f"{paths.short_path(found.path)}:{found.line}:{found.col}"
        line = (f"`nccl-doctor check` finds this before the run: {found.code} at {where} "
                f"({found.rule.title}).")
        out.append(replace(f, detail=f"{f.detail}\n{line}", evidence=replace(
            f.evidence, check_rule={"code": found.code, "path": found.path, "line": found.line,
                                    "column": found.col})))
    return out
