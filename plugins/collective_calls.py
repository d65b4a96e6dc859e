"""Collective library calls: when a side of a desync passes through a library function that every
rank must call (``Trainer.evaluate``, ``Accelerator.wait_for_everyone``, DCP's ``save``, ...),
the finding says so, and how to fix it.

The catalog is data (collective_calls.json beside this module; its fields and the matching rules
are in docs/plugins.md, "Collective library calls"), compiled once. A frame matches an entry when
its path holds one of the entry's path fragments, its function is one of the entry's qualnames
(``*.name``: a method ``name`` of any class there; a frame that records only the bare name, as
Python 3.10 and the in-rank stack dump do, matches by that last name), the rank's recorded
version of the package lies in the entry's range (or none is recorded), and, for an entry with
``with``, one of those fragments is on the same side's frames too.

Pure: a ``Diagnosis`` and the ranks' recorded versions in, the ``Diagnosis`` out with
``evidence["collective_calls"]``, a line of ``detail`` per call a side made (the catalogued calls
inside it named on that line) and, for desyncs, the fix leading the hint. A bad entry is skipped
with a reason (a note on the diagnosis), never raised.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping, Sequence

from nccl_doctor.analysis.calls.wording import ranks_text
from nccl_doctor.source.catalog import (  # (the catalog read as data, shared with check)
    Catalog, Entry, builtin_catalog, compile_catalog, in_range, parse_entry,
    read_catalog, version_key)
from nccl_doctor.diagnosis import Diagnosis, Finding, FindingKind

AnnotateFn = Callable[[Diagnosis, Mapping[str, str]], Diagnosis]

#: findings that are not about ranks whose call sequences diverged: left alone
_NOT_DESYNCS = frozenset({FindingKind.IDENTICAL_COMPLETIONS, FindingKind.SHARED_RNG_STATE,
                          FindingKind.DEGENERATE_SIGNAL, FindingKind.STRAGGLER})
_STACK_FRAME = re.compile(r"(?P<path>.*):(?P<line>\d+)(?: (?P<function>.*))?\Z")


# -- matching --------------------------------------------------------------------------------

@dataclass(frozen=True)
class _Frame:
    path: str  # "/"-separated
    line: int | None
    function: str
    package: str | None = None  # the package and version a call path's frame recorded
    version: str | None = None


@dataclass(frozen=True)
class _Side:
    ranks: tuple[int, ...]
    frames: tuple[_Frame, ...]  # innermost first
    source: str  # "call path" | "stack"


def _frame(raw: Any) -> _Frame | None:
    if isinstance(raw, Mapping):
        line, package, version = raw.get("line"), raw.get("package"), raw.get("version")
        return _Frame(str(raw.get("path") or "").replace("\\", "/"),
                      line if isinstance(line, int) else None, str(raw.get("function") or ""),
                      str(package) if package else None, str(version) if version else None)
    if isinstance(raw, str):  # a stack class's "<path>:<line> <qualname>"
        m = _STACK_FRAME.match(raw)
        if m:
            return _Frame(m["path"].replace("\\", "/"), int(m["line"]), m["function"] or "")
    return None


def _frames(raws: Any) -> tuple[_Frame, ...]:
    if not isinstance(raws, (list, tuple)):
        return ()
    return tuple(f for f in map(_frame, raws) if f is not None)


def _ranks(raw: Any) -> tuple[int, ...]:
    if not isinstance(raw, (list, tuple)):
        return ()
    return tuple(sorted({int(r) for r in raw if isinstance(r, int) or str(r).isdigit()}))


def _call_path_ranks(f: Finding) -> tuple[int, ...]:
    """Whose call ``f.call_path`` is: a missing_collective's and a GPU hang's are a waiting
    rank's, a stall's waiting for a busy peer too (which one is not recorded: none named), a
    mismatch's its first odd rank's; the others' are the culprits'."""
    ev = f.evidence
    if "waiting_ranks" in ev:
        return _ranks(ev["waiting_ranks"])
    if f.kind is FindingKind.GPU_BUSY_HANG and isinstance(ev.get("spinning"), Mapping):
        return _ranks(list(ev["spinning"]))
    if f.kind is FindingKind.MISSING_COLLECTIVE or (
            f.kind is FindingKind.STALL and ev.get("class") == "compute"):
        return ()
    return tuple(f.ranks[:1]) if f.kind is FindingKind.COLLECTIVE_MISMATCH else tuple(f.ranks)


def _sides(d: Diagnosis, f: Finding) -> list[_Side]:
    """Where the finding's ranks are: its call path (a missing_collective's is the waiting
    ranks'), each side's, each rank's that was elsewhere ("instead"), and their stacks."""
    ev = f.evidence
    out = [_Side(_call_path_ranks(f), _frames([fr.to_json() for fr in f.call_path]),
                 "call path")]
    for side in ev.get("sides") or ():
        if isinstance(side, Mapping):
            out.append(_Side(_ranks(side.get("ranks")), _frames(side.get("call_path")),
                             "call path"))
    instead = ev.get("instead")
    if isinstance(instead, Mapping):
        for rank, what in instead.items():
            if isinstance(what, Mapping):
                out.append(_Side(_ranks([rank]), _frames(what.get("call_path")), "call path"))
    relevant = set(f.ranks).union(*(s.ranks for s in out))
    for c in d.stack_classes:
        ranks = set(c.ranks)
        if relevant and not ranks & relevant:
            continue
        out.append(_Side(tuple(sorted(ranks & relevant if relevant else ranks)),
                         tuple(reversed(_frames(list(c.frames)))), "stack"))
    return [s for s in out if s.frames]


def _on_path(path: str, fragment: str) -> bool:
    return "/" + fragment in "/" + path


def _function_matches(spec: str, function: str) -> bool:
    name = spec.rpartition(".")[2]
    if spec.startswith("*."):
        return function == name or function.endswith("." + name)
    return function == spec or ("." not in function and function == name)


def _package(entry: Entry, frame: _Frame) -> str:
    return next((p for p in entry.packages if _on_path(frame.path, p + "/")), entry.packages[0])


def _call(entry: Entry, spec: str, function: str) -> str:
    """What the report calls the matched function: the frame's qualname; for a frame that has
    only the bare name, the entry's qualname when it is the only one of that name."""
    if "." in function or spec.startswith("*."):
        return function
    same = [fn for fn in entry.functions if fn.rpartition(".")[2] == function]
    return spec if len(same) == 1 else function


def _side_matches(catalog: Catalog, side: _Side, versions: Mapping[str, str]) -> list[dict]:
    """One record per entry matched on this side (its outermost frame: the call the side made),
    innermost first; each names the outermost record it lies ``within``."""
    found: dict[str, tuple[int, Entry, _Frame, str, str | None]] = {}
    for i, frame in enumerate(side.frames):
        for entry, spec in catalog.by_name.get(frame.function.rpartition(".")[2], ()):
            if not (_function_matches(spec, frame.function)
                    and any(_on_path(frame.path, p) for p in entry.paths)):
                continue
            package = _package(entry, frame)
            version = (frame.version if frame.package == package and frame.version
                       else versions.get(package))
            if not in_range(version, entry.versions):
                continue
            if entry.with_ and not any(_on_path(g.path, w) for g in side.frames
                                       for w in entry.with_):
                continue
            found[entry.id] = (i, entry, frame, _call(entry, spec, frame.function), version)
    records = []
    for _, entry, frame, call, version in sorted(found.values(), key=lambda x: x[0]):
        records.append({
            "id": entry.id, "ranks": list(side.ranks), "call": call,
            "package": _package(entry, frame), "version": version,
            "where": f"{frame.path}:{frame.line}" if frame.line is not None else frame.path,
            "what": entry.what, "fix": entry.fix, "when": entry.when or None,
            "seen_in": side.source, "within": None,
        })
    for r in records[:-1]:
        r["within"] = records[-1]["call"]
    return records


def _short(where: str) -> str:
    cut = max(where.rfind("site-packages/"), where.rfind("dist-packages/"))
    return where[cut + len("site-packages/"):] if cut >= 0 else where


def _line(call: str, records: list[dict], inner: list[str]) -> str:
    first = records[0]
    version = (f"{first['package']} {first['version']}" if first["version"]
               else f"{first['package']}, version not recorded")
    when = f" when {first['when']}" if first.get("when") else ""
    places = []
    for r in records:
        whose = f"{ranks_text(r['ranks'])}'s" if r["ranks"] else "a waiting rank's"
        stacks = "stacks are" if len(r["ranks"]) > 1 else "stack is"
        places.append(f"{whose} call path passes through it at {_short(r['where'])}"
                      if r["seen_in"] == "call path" else
                      f"{whose} {stacks} in it at {_short(r['where'])}")
    through = f"; inside it: {', '.join(f'`{c}`' for c in inner)}" if inner else ""
    return (f"`{call}` ({version}) is collective{when}: {first['what']} "
            f"({'; '.join(places)}{through}).")


def _fix_leads(f: Finding) -> bool:
    """Whether "call it on every rank" is the fix: the ranks' calls diverged, or ranks wait for
    a peer busy elsewhere - not a crash, a dead host or a stuck transport, where the catalog
    only says what the call is."""
    return f.kind in (FindingKind.MISSING_COLLECTIVE, FindingKind.COLLECTIVE_MISMATCH) or (
        f.kind is FindingKind.STALL and f.evidence.get("class") == "compute")


def _annotate_finding(d: Diagnosis, f: Finding, catalog: Catalog,
                      versions: Mapping[str, str]) -> Finding:
    old = [r for r in f.evidence.get("collective_calls") or () if isinstance(r, Mapping)]
    seen = {(r.get("call"), r.get("package"), tuple(r.get("ranks") or ())) for r in old}
    new = []
    for side in _sides(d, f):
        for r in _side_matches(catalog, side, versions):
            key = (r["call"], r["package"], tuple(r["ranks"]))
            if key not in seen:
                seen.add(key)
                new.append(r)
    if not new:
        return f
    named = {(r.get("call"), r.get("package")) for r in old}
    calls: dict[tuple[str, str], list[dict]] = {}
    for r in new:
        if r["within"] is None and (r["call"], r["package"]) not in named:
            calls.setdefault((r["call"], r["package"]), []).append(r)
    lines, fixes = [], []
    for (call, _), records in calls.items():
        inner = list(dict.fromkeys(r["call"] for r in reversed(new) if r["within"] == call))
        lines.append(_line(call, records, inner))
        if records[0]["fix"] not in fixes and records[0]["fix"] not in f.hint:
            fixes.append(records[0]["fix"])
    known = f.evidence.get("known_issue")
    hint = f.hint
    if fixes and _fix_leads(f) and not (isinstance(known, Mapping) and known.get("upstream")):
        hint = " ".join(fixes + ([f.hint] if f.hint else []))
    detail = "\n".join([f.detail] + lines if f.detail else lines)
    return replace(f, detail=detail, hint=hint,
                   evidence={**f.evidence, "collective_calls": old + new})


def _annotate(d: Diagnosis, versions: Mapping[str, str], catalog: Catalog, whose: str) -> Diagnosis:
    findings = tuple(f if f.kind in _NOT_DESYNCS else _annotate_finding(d, f, catalog, versions)
                     for f in d.findings)
    notes = tuple(n for n in (f"collective-call catalog ({whose}): {why}"
                              for why in catalog.skipped) if n not in d.notes)
    if findings == d.findings and not notes:
        return d
    return replace(d, findings=findings, notes=d.notes + notes)


def annotate(d: Diagnosis, versions: Mapping[str, str]) -> Diagnosis:
    """``d`` with each finding whose ranks pass through a catalogued collective call annotated.
    Registered as ``collective_calls`` in the ``nccl_doctor.known_issues`` entry points."""
    return _annotate(d, versions, builtin_catalog(), "nccl-doctor's")


def catalog_annotator(entries: Iterable[Mapping[str, Any]] | str | os.PathLike,
                      name: str = "plugin") -> AnnotateFn:
    """An annotator for your own entries (JSON-shaped mappings, or the path of a JSON file shaped
    like collective_calls.json), to register in the ``nccl_doctor.known_issues`` entry-point
    group (docs/plugins.md). Entries that do not parse leave a note naming ``name``."""
    if isinstance(entries, (str, os.PathLike)):
        try:
            catalog = read_catalog(Path(entries).read_text(encoding="utf-8"))
        except OSError as err:
            catalog = Catalog((), (f"{os.fspath(entries)} could not be read ({err}): no entry "
                                   "applied",), {})
    else:
        catalog = compile_catalog(list(entries))
    return lambda d, versions: _annotate(d, versions, catalog, name)


__all__: Sequence[str] = ("Catalog", "Entry", "annotate", "builtin_catalog", "catalog_annotator",
                          "compile_catalog", "parse_entry", "read_catalog", "version_key")
