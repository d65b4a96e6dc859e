"""``nccl-doctor check``: the static pre-flight. The source analysis the run uses to name the
branch on the rank (analysis/why/) is run before the job, on the files given: every collective
call site, and every call of a function of the user's that makes one, read for the
rank-dependent conditions and early exits that let some ranks skip it.

Pure: files in (``check_paths``), findings out (rules.py), rendered by formats.py."""

from nccl_doctor.check.engine import check_paths
from nccl_doctor.check.rules import RULES, CheckFinding

__all__ = ["RULES", "CheckFinding", "check_paths"]
