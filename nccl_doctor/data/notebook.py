"""What a notebook shows for a ``Diagnosis`` or a ``Finding``: report.html's own fragment
(reporters/html.py), the stacks' tree drawn for a diagnosis (analysis/page_builder.py) - as the
job's own display does (job.py). The model's ``_repr_html_`` finds this through the plugin
registry (entry_points.NOTEBOOK), never by importing it: the model does not depend on what
renders it."""

from __future__ import annotations

from typing import Any

from nccl_doctor.analysis.page_builder import page
from nccl_doctor.diagnosis import Diagnosis, Finding
from nccl_doctor.reporters.html import finding_fragment, fragment


def html(obj: Any) -> str | None:
    """``obj``'s HTML for a notebook's output (None: not one this draws)."""
    if isinstance(obj, Diagnosis):
        return fragment(obj, page(None, obj))
    if isinstance(obj, Finding):
        return finding_fragment(obj)
    return None
