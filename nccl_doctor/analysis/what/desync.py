"""Desyncs: the findings that say ranks' collective sequences diverged, and which one counts."""

from __future__ import annotations

from nccl_doctor.analysis.what.mismatch import detect_collective_mismatch
from nccl_doctor.analysis.what.missing import detect_missing_collective
from nccl_doctor.diagnosis import Finding, FindingKind
from nccl_doctor.model import TraceSet

DESYNC = {FindingKind.COLLECTIVE_MISMATCH, FindingKind.MISSING_COLLECTIVE}
#: what keeps the ranks it names from ever going on: with ranks still running at the capture's
#: end, the job is hung (diagnose's verdict)
HANGING = DESYNC | {FindingKind.GPU_BUSY_HANG, FindingKind.P2P_MISMATCH,
                    FindingKind.GROUP_MISMATCH, FindingKind.BLOCKED_WAIT}


def first_divergence_per_group(findings: list[Finding]) -> list[Finding]:
    """Keep one desync finding per group: the lowest sequence number (the cascade follows it)."""
    def order(f: Finding) -> tuple[int, bool]:  # lowest seq; a mismatch before a missing call
        return (f.seq or 0, f.kind is not FindingKind.COLLECTIVE_MISMATCH)

    first: dict[str, Finding] = {}
    for f in findings:
        if f.kind in DESYNC and f.group is not None:
            best = first.get(f.group)
            if best is None or order(f) < order(best):
                first[f.group] = f
    return [f for f in findings if f.kind not in DESYNC or f.group is None or first[f.group] is f]


def desyncs(traces: TraceSet) -> list[Finding]:
    """The first divergence of each group (what the full analysis reports)."""
    return first_divergence_per_group(detect_collective_mismatch(traces)
                                      + detect_missing_collective(traces))
