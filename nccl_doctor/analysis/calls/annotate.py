"""Annotators: what plugins add to a diagnosis (known-issue rules: the upstream bug and its fix).

Pure once loaded: an annotator takes the ``Diagnosis`` and the ranks' recorded library versions
and returns the ``Diagnosis`` with findings annotated. The analysis never imports a plugin: it
receives annotators, by default the installed ones: nccl-doctor's own rules
(plugins/known_issues.py, loaded by name) and every one registered in the
``nccl_doctor.known_issues`` entry-point group (nccl_doctor/entry_points.py).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Callable, Mapping, Sequence

from nccl_doctor import entry_points
from nccl_doctor.diagnosis import Diagnosis
from nccl_doctor.model import TraceSet

AnnotateFn = Callable[[Diagnosis, Mapping[str, str]], Diagnosis]


@dataclass(frozen=True)
class Annotator:
    name: str  # the entry point's name: said in a note when it fails
    annotate: AnnotateFn | None
    error: str | None = None  # why it could not be loaded


def installed() -> tuple[Annotator, ...]:
    """nccl-doctor's and every installed distribution's annotators (imported once per process)."""
    out = []
    for name, obj, err in entry_points.load(entry_points.KNOWN_ISSUES):
        if err is None and not callable(obj):
            err = TypeError(f"{type(obj).__name__} is not callable")
        out.append(Annotator(name, obj if err is None else None,
                             None if err is None else repr(err)))
    return tuple(out)


def versions_of(traces: TraceSet) -> dict[str, str]:
    """The library versions the ranks recorded (the first rank that has each)."""
    out: dict[str, str] = {}
    for _, trace in sorted(traces.ranks.items()):
        for name, version in trace.meta.versions.items():
            out.setdefault(str(name), str(version))
    return out


def apply(d: Diagnosis, annotators: Sequence[Annotator], versions: Mapping[str, str]) -> Diagnosis:
    """``d`` through each annotator in turn; one that fails (or never loaded) leaves a note and
    the diagnosis as it was."""
    notes = []
    for a in annotators:
        if a.annotate is None:
            notes.append(f"known-issue plugin {a.name!r} could not be loaded ({a.error}); "
                         "its rules were not applied")
            continue
        try:
            annotated = a.annotate(d, versions)
        except Exception as err:
            notes.append(f"known-issue plugin {a.name!r} failed ({err!r}); its rules were not "
                         "applied")
            continue
        if isinstance(annotated, Diagnosis):
            d = annotated
    return replace(d, notes=d.notes + tuple(notes)) if notes else d
