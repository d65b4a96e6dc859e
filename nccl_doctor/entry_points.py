"""Plugins: nccl-doctor's own (in plugins/, installed as nccl_doctor.plugins) and any installed
distribution's, registered in these entry-point groups. The one place that loads them.

- ``nccl_doctor.known_issues``: annotators, ``(Diagnosis, versions) -> Diagnosis``, that
  recognise a known upstream bug in a finding, or a library call that is collective
  (nccl_doctor.analysis.calls.annotate);
- ``nccl_doctor.integrations``: sequences of ``Integration`` (a module name and a patch applied
  when the rank imports it), installed in every rank (nccl_doctor.rank.hooks).
"""

from __future__ import annotations

import functools
from importlib import metadata
from typing import Any

KNOWN_ISSUES = "nccl_doctor.known_issues"
INTEGRATIONS = "nccl_doctor.integrations"
#: nccl-doctor's own plugins per group, ``(name, object reference)`` in the order they run, loaded
#: by name (not through the installed metadata, which an interpreter that merely imports
#: nccl_doctor from a path may not have): the known-issue rules, then the catalog of collective
#: library calls (plugins/collective_calls.json)
BUILTIN: dict[str, tuple[tuple[str, str], ...]] = {
    KNOWN_ISSUES: (("builtin", "nccl_doctor.plugins.known_issues:annotate"),
                   ("collective_calls", "nccl_doctor.plugins.collective_calls:annotate")),
    INTEGRATIONS: (("builtin", "nccl_doctor.plugins.integrations:INTEGRATIONS"),),
}


@functools.lru_cache(maxsize=None)
def load(group: str) -> tuple[tuple[str, Any, BaseException | None], ...]:
    """``(name, loaded object, None)`` per entry point of ``group``, or ``(name, None, error)``
    for one that failed to load: a broken plugin is reported, never raised."""
    own = BUILTIN.get(group, ())
    out = [_load(name, value, group) for name, value in own]
    try:
        found = metadata.entry_points(group=group)
    except Exception:  # damaged metadata of some installed distribution
        found = ()
    seen = {value for _, value in own}
    for ep in found:
        if ep.value in seen:  # the same plugin seen twice on sys.path
            continue
        seen.add(ep.value)
        out.append(_load(ep.name, ep.value, group))
    return tuple(out)


def _load(name: str, value: str, group: str) -> tuple[str, Any, BaseException | None]:
    try:
        return name, metadata.EntryPoint(name=name, value=value, group=group).load(), None
    except Exception as err:
        return name, None, err
