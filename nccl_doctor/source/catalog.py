"""The catalog of collective library calls, read as data: plugins/collective_calls.json, its
entries parsed and checked (a bad entry skipped with its reason, never raised), compiled once.
The run's plugin (plugins/collective_calls.py) matches a rank's frames against it; ``check``
(source/catalog_calls.py) a call site in the source. Pure but for reading the file."""

from __future__ import annotations

import functools
import json
import re
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any, Iterable, Mapping

__all__ = ["CATALOG_FILE", "Catalog", "Entry", "builtin_catalog", "compile_catalog", "in_range",
           "parse_entry", "read_catalog", "version_key"]

CATALOG_FILE = "collective_calls.json"
_REQUIRED = ("id", "package", "function", "paths", "what", "fix")
_OPTIONAL = ("versions", "when", "with", "checked_in")
_PACKAGE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")
_QUALNAME = re.compile(r"(\*\.)?[A-Za-z_<][\w<>]*(\.[A-Za-z_<][\w<>]*)*\Z")

@dataclass(frozen=True)
class Entry:
    id: str
    packages: tuple[str, ...]  # import names the code ships as (the first unless the path says)
    functions: tuple[str, ...]  # qualnames; "*.name": a method ``name`` of any class
    paths: tuple[str, ...]  # "/"-separated fragments, matched at a directory boundary
    versions: tuple[str | None, str | None]  # [first, first_not), None: open
    what: str  # why it is collective: "is collective: <what>"
    fix: str
    when: str = ""  # "is collective when <when>"
    with_: tuple[str, ...] = ()  # fragments one of which must be on the same side's frames
    checked_in: str = ""  # the release whose source the entry was read against


@dataclass(frozen=True)
class Catalog:
    entries: tuple[Entry, ...]
    skipped: tuple[str, ...]  # "entry 3 ('id') skipped: why", one per entry left out
    # a function's last name -> (entry, its function spec) pairs: the only ones a frame can match
    by_name: Mapping[str, tuple[tuple[Entry, str], ...]]


def _strings(raw: Any, field: str, pattern: re.Pattern[str] | None = None) -> tuple[str, ...]:
    items = [raw] if isinstance(raw, str) else raw
    if not isinstance(items, list) or not items:
        raise ValueError(f"{field} must be a string or a non-empty list of strings")
    for item in items:
        if not isinstance(item, str) or not item.strip():
            raise ValueError(f"{field} has {item!r}, expected a non-empty string")
        if pattern is not None and not pattern.match(item):
            raise ValueError(f"{field} has {item!r}, which is not a valid name")
    return tuple(items)


def version_key(text: str) -> tuple[int, int, int] | None:
    """``"2.13.0+cpu"`` -> (2, 13, 0); None when it holds no number (pre-release tags ignored)."""
    nums = [int(n) for n in re.findall(r"\d+", text.split("+")[0])[:3]]
    return (tuple(nums) + (0, 0, 0))[:3] if nums else None  # type: ignore[return-value]


def _text(raw: Mapping[str, Any], field: str, required: bool) -> str:
    value = raw.get(field, "" if not required else None)
    if not isinstance(value, str) or (required and not value.strip()):
        raise ValueError(f"{field} must be a{' non-empty' if required else ''} string")
    return value


def parse_entry(raw: Any) -> Entry:
    """One catalog entry from its JSON object; ``ValueError`` says what is wrong with it."""
    if not isinstance(raw, Mapping):
        raise ValueError(f"an entry is a JSON object, not {type(raw).__name__}")
    unknown = sorted(set(raw) - set(_REQUIRED) - set(_OPTIONAL))
    missing = [k for k in _REQUIRED if k not in raw]
    if unknown or missing:
        raise ValueError("; ".join(([f"unknown field {', '.join(map(repr, unknown))}"] if unknown
                                    else []) + ([f"missing {', '.join(missing)}"] if missing
                                                else [])))
    versions = raw.get("versions", [None, None])
    if not (isinstance(versions, list) and len(versions) == 2 and all(
            v is None or (isinstance(v, str) and version_key(v)) for v in versions)):
        raise ValueError(f"versions must be [first, first_not], each a version or null, "
                         f"not {versions!r}")
    if None not in versions and version_key(versions[0]) >= version_key(versions[1]):
        raise ValueError(f"versions {versions!r} is an empty range")
    return Entry(
        id=_text(raw, "id", True), packages=_strings(raw["package"], "package", _PACKAGE),
        functions=_strings(raw["function"], "function", _QUALNAME),
        paths=tuple(p.replace("\\", "/").lstrip("/") for p in _strings(raw["paths"], "paths")),
        versions=(versions[0], versions[1]), what=_text(raw, "what", True).rstrip(". "),
        fix=_text(raw, "fix", True), when=_text(raw, "when", False),
        with_=tuple(p.replace("\\", "/").lstrip("/") for p in _strings(raw["with"], "with"))
        if "with" in raw else (),
        checked_in=_text(raw, "checked_in", False))


def compile_catalog(raw_entries: Iterable[Any]) -> Catalog:
    """The catalog of the entries that parse; each other one is skipped with its reason."""
    entries: list[Entry] = []
    skipped: list[str] = []
    seen: set[str] = set()
    for i, raw in enumerate(raw_entries, 1):
        name = raw.get("id") if isinstance(raw, Mapping) else None
        label = f"entry {i}" + (f" ({name!r})" if isinstance(name, str) else "")
        try:
            entry = parse_entry(raw)
        except ValueError as err:
            skipped.append(f"{label} skipped: {err}")
            continue
        if entry.id in seen:
            skipped.append(f"{label} skipped: a second entry with this id")
            continue
        seen.add(entry.id)
        entries.append(entry)
    by_name: dict[str, list[tuple[Entry, str]]] = {}
    for entry in entries:
        for fn in entry.functions:
            by_name.setdefault(fn.rpartition(".")[2], []).append((entry, fn))
    return Catalog(tuple(entries), tuple(skipped), {k: tuple(v) for k, v in by_name.items()})


def read_catalog(text: str) -> Catalog:
    """A catalog from JSON text: ``{"entries": [...]}`` (or the bare list)."""
    try:
        data = json.loads(text)
    except ValueError as err:
        return Catalog((), (f"not JSON ({err}): no entry applied",), {})
    entries = data.get("entries") if isinstance(data, dict) else data
    if not isinstance(entries, list):
        return Catalog((), ('not {"entries": [...]}: no entry applied',), {})
    return compile_catalog(entries)


@functools.lru_cache(maxsize=None)
def builtin_catalog() -> Catalog:
    """nccl-doctor's catalog, shipped beside this module (read and compiled once)."""
    try:
        text = resources.files("nccl_doctor.plugins").joinpath(
            CATALOG_FILE).read_text(encoding="utf-8")
    except Exception:  # not a package (a plain import of this file): read it beside the file
        try:
            text = (Path(__file__).parents[2] / "plugins" / CATALOG_FILE).read_text(
                encoding="utf-8")
        except OSError as err:
            return Catalog((), (f"{CATALOG_FILE} could not be read ({err}): no entry "
                                "applied",), {})
    return read_catalog(text)


def in_range(version: str | None, bounds: tuple[str | None, str | None]) -> bool:
    key = version_key(version) if version else None
    if key is None:
        return True  # not recorded: it may be collective, and is said to be
    first, first_not = (version_key(b) if b else None for b in bounds)
    return (first is None or first <= key) and (first_not is None or key < first_not)
