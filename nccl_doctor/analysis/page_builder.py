"""What report.html draws beyond the diagnosis, computed from the captures and the diagnosis
(pure): the collective timeline, the stacks' call-prefix tree, the GPU samples, the straggler's
skew series, the ranks' versions. The HTML reporter only lays it out."""

from __future__ import annotations

from nccl_doctor.analysis.slow.straggler import skew_series
from nccl_doctor.analysis.calls.timeline import timeline
from nccl_doctor.diagnosis import Diagnosis, FindingKind
from nccl_doctor.model import TraceSet
from nccl_doctor.page_model import Page
from nccl_doctor.stacks.tree import prefix_tree


def page(traces: TraceSet | None, diagnosis: Diagnosis) -> Page:
    """The page of ``diagnosis``, drawn from ``traces`` (None: the diagnosis alone)."""
    tree = prefix_tree(diagnosis.stack_classes)
    if traces is None:
        return Page(tree=tree)
    straggler = any(f.kind is FindingKind.STRAGGLER for f in diagnosis.findings)
    return Page(timeline=timeline(traces, diagnosis), tree=tree, gpu=traces.gpu,
                skews=tuple(skew_series(traces)) if straggler else (),
                versions=_versions(traces))


def _versions(traces: TraceSet) -> dict[str, str]:
    """Each package's version as the ranks reported it ("2.13.0", or "2.13.0 / 2.12.1" when
    they differ)."""
    seen: dict[str, list[str]] = {}
    for trace in traces.ranks.values():
        for name, version in trace.meta.versions.items():
            if version not in seen.setdefault(name, []):
                seen[name].append(version)
    return {name: " / ".join(vs) for name, vs in sorted(seen.items())}
