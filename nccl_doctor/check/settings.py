"""``[tool.nccl-doctor.check]`` in the project's pyproject.toml: rules switched off, per file
or everywhere, and paths left out. Read from the nearest pyproject.toml above the current
directory that has the table; a table that says something else is a usage error, one line.

    [tool.nccl-doctor.check]
    ignore = ["ND003"]                        # these rules, everywhere
    per-file-ignores = {"scripts/*" = ["ND001"]}  # these rules, in the files matching
    exclude = ["legacy/*"]                    # files not read at all
"""

from __future__ import annotations

import fnmatch
from dataclasses import dataclass, field
from pathlib import Path

from nccl_doctor.errors import UsageError

_KEYS = {"ignore", "per-file-ignores", "exclude"}


@dataclass(frozen=True)
class Settings:
    ignore: frozenset[str] = frozenset()
    per_file: tuple[tuple[str, frozenset[str]], ...] = ()
    exclude: tuple[str, ...] = ()
    root: Path = field(default_factory=Path.cwd)  # where the patterns are relative to
    source: str = ""  # the pyproject.toml read ("" none)

    def _rel(self, path: str) -> str:
        try:
            return Path(path).resolve().relative_to(self.root.resolve()).as_posix()
        except ValueError:
            return Path(path).as_posix()

    def excluded(self, path: str) -> bool:
        rel = self._rel(path)
        # (a folder's pattern, "legacy/" or "legacy/*", holds every file below it)
        return any(fnmatch.fnmatch(rel, p) or rel.startswith(p.rstrip("*").rstrip("/") + "/")
                   for p in self.exclude)

    def silenced(self, path: str, code: str) -> bool:
        if code in self.ignore:
            return True
        rel = self._rel(path)
        return any(code in codes and fnmatch.fnmatch(rel, pattern)
                   for pattern, codes in self.per_file)


def find(start: Path | None = None) -> Settings:
    """The settings of the nearest pyproject.toml (from ``start``, default the current
    directory, upwards) that has ``[tool.nccl-doctor.check]``; defaults when none does."""
    import tomllib

    here = (start or Path.cwd()).resolve()
    for folder in (here, *here.parents):
        candidate = folder / "pyproject.toml"
        if not candidate.is_file():
            continue
        try:
            data = tomllib.loads(candidate.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as err:
            raise UsageError(f"{candidate} cannot be read as TOML ({err}): fix it, or run "
                             "check from another folder") from None
        table = data.get("tool", {}).get("nccl-doctor", {}).get("check")
        if table is None:
            continue
        return _parse(table, candidate)
    return Settings()


def _parse(table: object, where: Path) -> Settings:
    from nccl_doctor.check.rules import RULES

    def codes(value: object, key: str) -> frozenset[str]:
        if not isinstance(value, list) or not all(isinstance(c, str) for c in value):
            raise UsageError(f"{where}: [tool.nccl-doctor.check] {key} must be a list of rule "
                             f"codes (e.g. [\"ND003\"])")
        unknown = sorted(set(value) - set(RULES))
        if unknown:
            raise UsageError(f"{where}: [tool.nccl-doctor.check] {key}: no rule {unknown[0]} "
                             f"(the rules: {', '.join(sorted(RULES))})")
        return frozenset(value)

    if not isinstance(table, dict):
        raise UsageError(f"{where}: [tool.nccl-doctor.check] must be a table")
    unknown = sorted(set(table) - _KEYS)
    if unknown:
        raise UsageError(f"{where}: [tool.nccl-doctor.check] has no setting {unknown[0]!r} "
                         f"(the settings: {', '.join(sorted(_KEYS))})")
    per = table.get("per-file-ignores", {})
    if not isinstance(per, dict):
        raise UsageError(f"{where}: [tool.nccl-doctor.check] per-file-ignores must be a table "
                         "of glob = [codes]")
    exclude = table.get("exclude", [])
    if not isinstance(exclude, list) or not all(isinstance(p, str) for p in exclude):
        raise UsageError(f"{where}: [tool.nccl-doctor.check] exclude must be a list of globs")
    return Settings(ignore=codes(table.get("ignore", []), "ignore"),
                    per_file=tuple((str(k), codes(v, f"per-file-ignores {k!r}"))
                                   for k, v in per.items()),
                    exclude=tuple(exclude), root=where.parent, source=str(where))
