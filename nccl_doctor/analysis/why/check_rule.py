"""The run points back (issue 51): when a run's root cause is a branch on the rank that
``nccl-doctor check`` finds before the run (or a ``generate`` it finds unsynced on a sharded
model), the report names the rule.

The branch's file is checked as ``check`` reads it - only when its bytes are still those the
run recorded (the fingerprint a rank took of it): line numbers of an edited file mean nothing."""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path

from nccl_doctor import paths
from nccl_doctor.analysis.calls.annotate import versions_of
from nccl_doctor.source.source_text import digest
from nccl_doctor.check.rules import CheckFinding
from nccl_doctor.diagnosis import Finding
from nccl_doctor.model import TraceSet


_WHERE = re.compile(r"(?P<path>.+?):(?P<line>\d+)(?:\s.*)?\Z")  # path:line [function]


def rule_for(f: Finding, traces: TraceSet) -> CheckFinding | None:
    """The ``check`` finding whose condition is ``f``'s culprit branch, or (with no branch)
    whose call is one of ``f``'s lines in the user's code (ND005: the ``generate`` a sharded
    model hung in), if any."""
    b = f.branch
    if b is not None and b.culprit and b.path:
        found = _checked(b.path, traces)
        return next((c for c in found if c.condition_line == b.line), None)
    lines: dict[str, list[int]] = {}  # path -> its lines named, in their order: each file
    for where in _your_lines(f):       # checked once
        m = _WHERE.match(where)
        if m is not None:
            lines.setdefault(m["path"], []).append(int(m["line"]))
    for path, named in lines.items():
        found: dict[int, CheckFinding] = {}
        for c in _checked(path, traces):
            if c.code == "ND005":
                found.setdefault(c.line, c)  # (the first on its line, as check orders them)
        hit = next((found[line] for line in named if line in found), None)
        if hit is not None:
            return hit
    return None


def _checked(path: str, traces: TraceSet) -> tuple[CheckFinding, ...]:
    """``check``'s findings in the file at ``path``, when its bytes are those a rank recorded."""
    recorded = {t.meta.sources.get(path) for t in traces.ranks.values()} - {None}
    try:
        if not recorded or digest(Path(path).read_bytes()) not in recorded:
            return ()
    except OSError:
        return ()
    # (imported here, when a root cause asks: check's engine and catalog are not the run's own
    # start-up cost - the supervisor imports this module before the job starts)
    from nccl_doctor.check.engine import check_paths

    # (the catalog matched by the libraries the ranks ran, not this interpreter's)
    return check_paths([Path(path)], versions=versions_of(traces)).findings


def _your_lines(f: Finding) -> list[str]:
    """The user's lines ``f`` names (its own, each side's, where it entered the library, the
    loop whose counts differ), as ``path:line``."""
    ev = f.evidence
    lines = [getattr(ev, "your_line", None), getattr(f, "entry_callsite", None)]
    lines += [s.get("your_line") for s in getattr(ev, "sides", ()) if isinstance(s, Mapping)]
    loop = getattr(ev, "loop", None)
    if isinstance(loop, Mapping) and loop.get("path") and loop.get("line"):
        lines.append(f"{loop['path']}:{loop['line']}")
    return list(dict.fromkeys(x for x in lines if isinstance(x, str) and x))


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
