"""Plugins: nccl-doctor's own (in plugins/, installed as nccl_doctor.plugins) and any installed
distribution's, registered in these entry-point groups. The one place that loads them.

- ``nccl_doctor.known_issues``: annotators, ``(Diagnosis, versions) -> Diagnosis``, that
  recognise a known upstream bug in a finding, or a library call that is collective
  (nccl_doctor.analysis.calls.annotate);
- ``nccl_doctor.integrations``: sequences of ``Integration`` (a module name and a patch applied
  when the rank imports it), installed in every rank (nccl_doctor.rank.hooks);
- ``nccl_doctor.notebook``: ``(Diagnosis | Finding) -> str | None``, the HTML a notebook shows
  for it (nccl_doctor.diagnosis ``notebook_html``; nccl-doctor's own: report.html's fragment).
"""

from __future__ import annotations

import functools
import importlib
import importlib.machinery
import os
import re
import sys
from typing import Any, Iterator

KNOWN_ISSUES = "nccl_doctor.known_issues"
INTEGRATIONS = "nccl_doctor.integrations"
NOTEBOOK = "nccl_doctor.notebook"
#: nccl-doctor's own plugins per group, ``(name, object reference)`` in the order they run, loaded
#: by name (not through the installed metadata, which an interpreter that merely imports
#: nccl_doctor from a path may not have): the known-issue rules, then the catalog of collective
#: library calls (plugins/collective_calls.json)
BUILTIN: dict[str, tuple[tuple[str, str], ...]] = {
    KNOWN_ISSUES: (("builtin", "nccl_doctor.plugins.known_issues:annotate"),
                   ("collective_calls", "nccl_doctor.plugins.collective_calls:annotate")),
    INTEGRATIONS: (("builtin", "nccl_doctor.plugins.integrations:INTEGRATIONS"),),
    NOTEBOOK: (("html", "nccl_doctor.data.notebook:html"),),
}


@functools.lru_cache(maxsize=None)
def load(group: str) -> tuple[tuple[str, Any, BaseException | None], ...]:
    """``(name, loaded object, None)`` per entry point of ``group``, or ``(name, None, error)``
    for one that failed to load: a broken plugin is reported, never raised."""
    own = BUILTIN.get(group, ())
    out = [_load(name, value) for name, value in own]
    try:
        found = list(installed(group))
    except Exception:  # damaged metadata of some installed distribution
        found = []
    seen = {value for _, value in own}
    for name, value in found:
        if value in seen:  # the same plugin seen twice on sys.path
            continue
        seen.add(value)
        out.append(_load(name, value))
    return tuple(out)


def installed(group: str) -> Iterator[tuple[str, str]]:
    """``(name, value)`` of each installed distribution's entry point in ``group``, as
    ``importlib.metadata.entry_points(group=...)`` gives them: the distributions found on
    ``sys.path`` in its order, the first of a name only. The ``.dist-info`` and ``.egg-info``
    folders of path entries are read directly: importing ``importlib.metadata`` (email, zipfile,
    csv) cost every rank about 10 ms. Where distributions can come from elsewhere (a zip on
    ``sys.path``, a finder of another package's), ``importlib.metadata`` reads them."""
    if not _plain_paths():
        from importlib import metadata

        for ep in metadata.entry_points(group=group):
            yield ep.name, ep.value
        return
    names: set[str] = set()
    header = f"[{group}]"
    for entry in sys.path:
        try:
            listing = sorted(os.listdir(entry or "."))
        except OSError:
            continue
        for folder in listing:
            if not folder.endswith((".dist-info", ".egg-info")):
                continue
            name = _distribution(folder)
            if name in names:
                continue
            names.add(name)
            try:
                with open(os.path.join(entry or ".", folder, "entry_points.txt"),
                          encoding="utf-8") as f:
                    text = f.read()
            except (OSError, UnicodeDecodeError):
                continue
            if header in text:
                yield from _section(text, group)


def _plain_paths() -> bool:
    """Whether every distribution importlib.metadata would find is a folder on sys.path."""
    path_finder = importlib.machinery.PathFinder
    for finder in sys.meta_path:
        if finder is not path_finder and hasattr(finder, "find_distributions"):
            return False
    return not any(entry and os.path.isfile(entry) for entry in sys.path)


def _distribution(folder: str) -> str:
    """The normalized distribution name of a metadata folder (``Foo_Bar-1.0.dist-info``,
    ``foo.egg-info``, ``foo-1.0-py3.11.egg-info``): ``foo_bar``."""
    stem = folder.rsplit(".", 1)[0].split("-", 1)[0]
    return re.sub(r"[-_.]+", "_", stem).lower()


def _section(text: str, group: str) -> Iterator[tuple[str, str]]:
    """The ``name = value`` lines of section ``[group]`` of an entry_points.txt."""
    inside = False
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line[0] in "#;":
            continue
        if line.startswith("[") and line.endswith("]"):
            inside = line[1:-1].strip() == group
        elif inside and "=" in line:
            name, value = (part.strip() for part in line.split("=", 1))
            yield name, value


def _load(name: str, value: str) -> tuple[str, Any, BaseException | None]:
    """The object ``module:attr.sub [extras]`` names, or the error that loading it raised."""
    try:
        reference = value.split("[", 1)[0].strip()
        module_name, _, attrs = reference.partition(":")
        found = importlib.import_module(module_name.strip())
        for attr in filter(None, attrs.strip().split(".")):
            found = getattr(found, attr)
        return name, found, None
    except Exception as err:
        return name, None, err
