"""``nccl-doctor check``: the static pre-flight. The source analysis the run uses to name the
branch on the rank (analysis/why/) is run before the job, on the files given: every collective
call site, and every call of a function of the user's that makes one, read for the
rank-dependent conditions and early exits that let some ranks skip it.

Pure: files in (``check_paths``), findings out (rules.py), rendered by formats.py. Its names
are imported on first use: the command line's parser reads ``FORMATS`` without the analysis."""

from __future__ import annotations

from typing import Any

FORMATS = ("console", "json", "sarif")

__all__ = ["FORMATS", "RULES", "CheckFinding", "check_paths"]


def __getattr__(name: str) -> Any:
    if name == "check_paths":
        from nccl_doctor.check.engine import check_paths

        return check_paths
    if name in ("RULES", "CheckFinding"):
        from nccl_doctor.check import rules

        return getattr(rules, name)
    raise AttributeError(name)
