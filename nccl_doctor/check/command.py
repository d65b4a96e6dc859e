"""``nccl-doctor check -- torchrun ... train.py``: the files a launch command runs - its script
(or ``-m`` module) and the user's own modules it imports, followed import by import - as the
run decides what is the user's code (nccl_doctor/paths.py: not a library's)."""

from __future__ import annotations

import ast
from pathlib import Path
from typing import Sequence

from nccl_doctor import paths
from nccl_doctor.errors import UsageError

MAX_FILES = 512  # modules of the user's followed from one script


def entry_of(argv: Sequence[str], cwd: Path) -> Path:
    """The program a launch command runs: the first ``.py`` argument that exists, or the module
    after ``-m`` (``python -m pkg.train``, ``torchrun -m pkg.train``) found under ``cwd``."""
    for i, word in enumerate(argv):
        if word == "-m" and i + 1 < len(argv):
            found = _module_file(argv[i + 1], [cwd])
            if found is not None:
                return found
        if word.endswith(".py") and (cwd / word).is_file():
            return cwd / word
    raise UsageError(f"no Python script in the command {' '.join(argv)!r}: give check the "
                     "script (check -- torchrun train.py), a -m module under this folder, or "
                     "the files themselves")


def configs_of_command(argv: Sequence[str], cwd: Path | None = None) -> list[Path]:
    """The config files a launch command names (``--deepspeed ds_z3.json``, ``accelerate
    launch --config_file fsdp.yaml``, ``--deepspeed=ds.json``): read for the sharding (ND005)."""
    cwd = cwd or Path.cwd()
    out = []
    for word in argv:
        value = word.partition("=")[2] if word.startswith("-") else word
        if value.endswith((".json", ".yaml", ".yml")) and (cwd / value).is_file():
            out.append(cwd / value)
    return out


def files_of_command(argv: Sequence[str], cwd: Path | None = None) -> list[Path]:
    """The script of ``argv`` and the user's modules it imports, transitively."""
    cwd = cwd or Path.cwd()
    entry = entry_of(argv, cwd)
    roots = [entry.parent, cwd]
    seen: dict[Path, None] = {}
    todo = [entry.resolve()]
    while todo and len(seen) < MAX_FILES:
        path = todo.pop(0)
        if path in seen:
            continue
        seen[path] = None
        try:
            tree = ast.parse(path.read_bytes())
        except (OSError, SyntaxError, ValueError):
            continue  # (check says why when it reads it)
        for name in _imported(tree, path):
            found = _module_file(name, [path.parent, *roots])
            if found is not None and paths.is_user_file(str(found)):
                todo.append(found.resolve())
    return list(seen)


def _imported(tree: ast.Module, path: Path) -> list[str]:
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out += [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative: from the file's package
                pkg = path.parent
                for _ in range(node.level - 1):
                    pkg = pkg.parent
                out += [str(pkg / base.replace(".", "/")) if base else str(pkg)]
                out += [str(pkg / (base.replace(".", "/") + "/" + a.name) if base
                            else pkg / a.name) for a in node.names]
            else:
                out += [base] + [f"{base}.{a.name}" for a in node.names]
    return out


def _module_file(name: str, roots: Sequence[Path]) -> Path | None:
    """The file of module ``name`` (dotted, or a path from a relative import) under ``roots``."""
    rel = Path(name) if "/" in name else Path(*name.split("."))
    candidates = [rel] if rel.is_absolute() else [root / rel for root in roots]
    for base in candidates:
        for found in (base.with_suffix(".py"), base / "__init__.py"):
            if found.is_file():
                return found
    return None
