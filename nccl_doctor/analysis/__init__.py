"""Analysis: pure passes from a ``TraceSet`` to findings, assembled into a ``Diagnosis``."""

from nccl_doctor.analysis.diagnose import PASSES, analyze

__all__ = ["PASSES", "analyze"]
