"""Analysis: pure passes from a ``TraceSet`` to findings, assembled into a ``Diagnosis``."""

from nccl_doctor.analysis.diagnose import PASSES, SILENT_PASSES, analyze

__all__ = ["PASSES", "SILENT_PASSES", "analyze"]
