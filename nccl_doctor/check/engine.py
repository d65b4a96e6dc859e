"""Files in, findings out: each collective call site (and each call of a function of the user's
that makes one, source/sites.py) read by the run's own branch analysis (source/branch.py
``branches``, one engine for both): the rank-dependent conditions that enclose it or jump past
it are the findings. Pure but for reading the files named.

A condition whose other arm makes the same collective splits nobody (``if rank == 0:
dist.broadcast(t, 0) else: dist.broadcast(t, 0)``) and is not said. ``# nccl-doctor:
ignore[ND001]`` (or a bare ``# nccl-doctor: ignore``) on the call's line or the condition's
silences it. A file that cannot be read or parsed is a problem, one line, never a traceback."""

from __future__ import annotations

import ast
import io
import os
import re
import tokenize
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Mapping, Sequence

from nccl_doctor.source.branch import branches, leaves_function
from nccl_doctor.source.rank_flow import call_name
from nccl_doctor.source.rank_terms import membership_subjects
from nccl_doctor.source.source_text import Sources
from nccl_doctor.check.generate import generate_findings
from nccl_doctor.source.sharding import Shown
from nccl_doctor.check.rules import CheckFinding
from nccl_doctor.check.settings import Settings
from nccl_doctor.source.sites import Module, Site, collective_of, read_module, user_sites
from nccl_doctor.location import Location

MAX_BYTES = 2_000_000  # a file larger than this is not read (as the run's source analysis)
_SKIP_DIRS = frozenset({".git", ".hg", ".venv", "venv", "__pycache__", "node_modules", ".tox",
                        "build", "dist", ".mypy_cache", ".pytest_cache"})
_IGNORE = re.compile(r"#\s*nccl-doctor:\s*ignore(?:\[([A-Z0-9, ]+)\])?")


@dataclass(frozen=True)
class CheckReport:
    findings: tuple[CheckFinding, ...]
    files: int  # files read
    problems: tuple[str, ...]  # files that could not be read, one line each


def python_files(paths: Sequence[Path]) -> Iterable[Path]:
    """The .py files named or under the folders named, in a stable order."""
    for p in paths:
        if p.is_dir():
            for root, dirs, files in os.walk(p):
                dirs[:] = sorted(d for d in dirs if d not in _SKIP_DIRS and not d.startswith("."))
                for name in sorted(files):
                    if name.endswith(".py"):
                        yield Path(root) / name
        else:
            yield p


def check_paths(paths: Sequence[Path], settings: Settings | None = None,
                configs: Sequence[Path] = (), versions: Mapping[str, str] | None = None
                ) -> CheckReport:
    """``settings``: rules off and files left out ([tool.nccl-doctor.check]; none: every rule,
    every file). ``configs``: config files the launch command names (``--deepspeed
    ds_z3.json``), read for the sharding ND005 needs seen. ``versions``: the libraries' versions
    the catalog is matched by (a run's ranks recorded them; none: those installed here)."""
    pinned = tuple(sorted((versions or {}).items()))
    settings = settings or Settings()
    modules: list[Module] = []
    problems: list[str] = []
    texts: dict[str, list[str]] = {}
    for path in python_files(paths):
        if settings.excluded(str(path)):
            continue
        got = _parse(path)
        if isinstance(got, str):
            problems.append(f"{path}: {got}")
            continue
        tree, lines = got
        key = str(path.resolve())
        texts[key] = lines
        modules.append(read_module(key, tree, pinned))
    sites = [s for m in modules for s in m.sites] + user_sites(modules)
    sources = Sources(verify=False, max_bytes=MAX_BYTES, max_files=max(64, len(modules) + 8))
    trees = {m.path: m for m in modules}
    found: dict[tuple, CheckFinding] = {}
    callers = _callers(modules)
    for site in sites:
        outer = callers.get((site.path, site.function.rpartition(".")[2]), [None])
        for caller in outer[:_CALLERS]:
            for f in _site_findings(site, sources, trees[site.path], texts[site.path], caller):
                found.setdefault((f.code, f.path, f.line, f.col, f.condition_line), f)
    shown = _sharding_by_module(modules, texts, configs)
    for module in modules:
        if module.path not in shown:
            continue
        for f in generate_findings(module, shown[module.path]):
            if not _ignored(texts[module.path], f.line, f.code):
                found.setdefault((f.code, f.path, f.line, f.col, f.condition_line), f)
    kept = [f for f in _without_complements(list(found.values()), sites)
            if not settings.silenced(f.path, f.code)]
    ordered = sorted(kept, key=lambda f: (f.path, f.line, f.col, f.code))
    return CheckReport(tuple(ordered), len(modules), tuple(problems))


def _sharding_by_module(modules: list[Module], texts: Mapping[str, list[str]],
                        configs: Sequence[Path]) -> dict[str, Shown]:
    """Each module that calls ``generate`` -> the sharding seen where it is linked: a config
    file of the command, or a module it imports or is imported by, directly, by a name that is
    one module's alone among those checked (a library's hundreds of files are not one
    program). Only those modules and their neighbours are read for it."""
    from nccl_doctor.source.sharding import config_sharding, sharding

    callers = [m for m in modules if any(".generate(" in line for line in texts[m.path])]
    if not callers:
        return {}
    command = next((Shown(what, str(c.resolve()), 1) for c in configs
                    if (what := config_sharding(c)) is not None), None)
    stems: dict[str, list[str]] = {}
    for m in modules:
        stems.setdefault(Path(m.path).stem, []).append(m.path)
    links: dict[str, set[str]] = {m.path: set() for m in modules}
    for m in modules:
        for name in m.imports:
            found = stems.get(name.rpartition(".")[2], [])
            if len(found) == 1 and found[0] != m.path:
                links[m.path].add(found[0])
                links[found[0]].add(m.path)
    by_path = {m.path: m for m in modules}
    own: dict[str, Shown | None] = {}

    def shown(path: str) -> Shown | None:
        if path not in own:
            own[path] = sharding(by_path[path])
        return own[path]

    out: dict[str, Shown] = {}
    for m in callers:
        found = shown(m.path) or next((s for p in sorted(links[m.path])
                                       if (s := shown(p)) is not None), command)
        if found is not None:
            out[m.path] = found
    return out


def _without_complements(findings: list[CheckFinding], sites: list[Site]) -> list[CheckFinding]:
    """The "one rank first" idiom: the same collective in one function under a condition and,
    in another statement, under its negation (``if not is_main: dist.barrier()``, then, after
    the main process did its work, ``if is_main: dist.barrier()``): every rank makes it once,
    at a different place - they pair. Both are left out."""
    function = {(s.path, s.line, s.col): s.function for s in sites}
    by_place: dict[tuple, list[CheckFinding]] = {}
    for f in findings:
        if f.code == "ND001":
            key = (f.path, function.get((f.path, f.line, f.col - 1)), f.call.rpartition(".")[2])
            by_place.setdefault(key, []).append(f)
    paired: set[int] = set()
    for group in by_place.values():
        for a in group:
            for b in group:
                if a.condition_line != b.condition_line and _opposite(a, b):
                    paired.update((id(a), id(b)))
    return [f for f in findings if id(f) not in paired]


def _opposite(a: CheckFinding, b: CheckFinding) -> bool:
    """The two calls stand on opposite sides: under complementary conditions in the same arm,
    or under the same condition in opposite arms (``if not is_main: ... else: barrier()``,
    then ``if is_main: barrier()`` does not pair)."""
    if {a.arm, b.arm} == {"if", "else"}:
        x, y = _test(a.condition), _test(b.condition)
        return x is not None and y is not None and ast.dump(x) == ast.dump(y)
    return _complements(a.condition, b.condition)


def _test(text: str) -> ast.expr | None:
    """The test of an ``if``/``elif``/``while`` line's text, parsed (None when it is not whole
    on the line)."""
    t = re.sub(r"^(?:el)?if\s+|^while\s+", "", text.strip()).rstrip(":").strip()
    try:
        return ast.parse(t, mode="eval").body
    except SyntaxError:
        return None


_FLIP = {ast.Eq: ast.NotEq, ast.NotEq: ast.Eq, ast.In: ast.NotIn, ast.NotIn: ast.In,
         ast.Is: ast.IsNot, ast.IsNot: ast.Is}


def _complements(a: str, b: str) -> bool:
    x, y = _test(a), _test(b)
    if x is None or y is None:
        return False
    if isinstance(x, ast.UnaryOp) and isinstance(x.op, ast.Not):
        return ast.dump(x.operand) == ast.dump(y)
    if isinstance(y, ast.UnaryOp) and isinstance(y.op, ast.Not):
        return ast.dump(y.operand) == ast.dump(x)
    if isinstance(x, ast.Compare) and len(x.ops) == 1 and type(x.ops[0]) in _FLIP:
        flipped = ast.Compare(left=x.left, ops=[_FLIP[type(x.ops[0])]()],
                              comparators=x.comparators)
        return ast.dump(flipped) == ast.dump(y)
    return False


def decoded(data: bytes) -> tuple[str, str]:
    """A Python file's text as its encoding declaration (or UTF-8) says, newlines as they are,
    and that encoding (``--fix`` writes it back in the same)."""
    encoding, _ = tokenize.detect_encoding(io.BytesIO(data).readline)
    return data.decode(encoding), encoding


def _parse(path: Path) -> tuple[ast.Module, list[str]] | str:
    try:
        size = path.stat().st_size
        if size > MAX_BYTES:
            return f"not read: {size} bytes, over the {MAX_BYTES} a file is read"
        data = path.read_bytes()
    except OSError as err:
        return f"cannot be read ({err.strerror or err})"
    try:
        text, _ = decoded(data)
    except (SyntaxError, LookupError, UnicodeDecodeError) as err:
        return f"cannot be decoded ({type(err).__name__}: {err})"
    try:
        tree = ast.parse(text, str(path))
    except (SyntaxError, ValueError, RecursionError, MemoryError) as err:
        line = getattr(err, "lineno", None)
        return f"not Python this interpreter parses ({type(err).__name__}" + (
            f" at line {line}" if line else "") + ")"
    return tree, text.splitlines()


#: callers of a function read for the rank-derived arguments they pass it (each one more path)
_CALLERS = 8


def _callers(modules: list[Module]) -> dict[tuple[str, str], list[Location | None]]:
    """(path, function name) -> the lines that call it by its bare name (in its own file, or
    where it is imported by name), as the caller's frame: the run reads a parameter as the
    rank's when its caller passed a rank-derived argument (source/branch.py ``_seeds``);
    ``check`` gives it the same two frames. None first: the function read alone."""
    stems = {Path(m.path).stem: m.path for m in modules}
    out: dict[tuple[str, str], list[Location | None]] = {}
    for mod in modules:
        for callee, cls, site, _ in mod.calls:
            if cls is not None:
                continue
            target = mod.path
            if callee in mod.imported:
                module, name = mod.imported[callee]
                target, callee = stems.get(module.rpartition(".")[2], ""), name
            if target:
                out.setdefault((target, callee), [None]).append(
                    Location(site.path, site.line, site.function))
    return out


def _site_findings(site: Site, sources: Sources, module: Module, lines: list[str],
                   caller: Location | None = None) -> Iterable[CheckFinding]:
    frame = Location(site.path, site.line, site.function)
    try:
        got, _ = branches((frame,) if caller is None else (frame, caller), sources)
    except Exception:  # a file we cannot analyse costs its findings, not the check
        return ()
    out = []
    for b in got:
        if b.path != site.path or b.frame != frame:
            continue  # (a branch in the caller's frame is its own site's: ND002)
        if b.kind in ("if", "else") and _both_arms(module.tree, b.line, site):
            order = _creation_order(module.tree, b.line, site)
            if order is not None and not _ignored(lines, b.line, "ND006"):
                line, col, orders = order
                out.append(CheckFinding(code="ND006", path=site.path, line=line, col=col + 1,
                                        call=orders, condition=b.text, condition_line=b.line,
                                        names=tuple(b.names), how=b.via[0] if b.via else ""))
            continue
        if b.kind == "jump" and _both_leave(module.tree, b.line):
            continue
        if _of_members(module.tree, b.line, site) or not site.user and (
                _members_only(module.tree, b.line, b.names, site)
                or _local_creation(module.tree, site)):
            continue
        entry = _entry(site, module.versions)
        code = "ND003" if b.kind in ("jump", "for") else (
            "ND002" if site.user else "ND004" if entry is not None else "ND001")
        if _ignored(lines, site.line, code) or _ignored(lines, b.line, code):
            continue
        out.append(CheckFinding(code=code, path=site.path, line=site.line, col=site.col + 1,
                                call=site.call, condition=b.text, condition_line=b.line,
                                arm=b.kind,
                                names=tuple(b.names),
                                via=(site.collective if site.user else
                                     f"{entry.package}: {entry.what}" if entry else ""),
                                fix=entry.fix if entry is not None else "",
                                how=b.via[0] if b.via else ""))
    return out


def _entry(site: Site, versions: tuple[tuple[str, str], ...] = ()):
    """The catalog entry a library call site makes (source/catalog_calls.py), or None."""
    if not site.collective.startswith("catalog:"):
        return None
    from nccl_doctor.source import catalog_calls as catalog

    return catalog.entries(versions).get(site.collective.partition(":")[2])


def _ignored(lines: list[str], line: int, code: str) -> bool:
    if not 1 <= line <= len(lines):
        return False
    m = _IGNORE.search(lines[line - 1])
    if m is None:
        return False
    codes = m.group(1)
    return codes is None or code in {c.strip() for c in codes.split(",")}


def _both_arms(tree: ast.Module, line: int, site: Site) -> bool:
    """The ``if`` at ``line`` makes the site's collective (or calls its function) in both arms."""
    node = _statement_at(tree, line, ast.If)
    if node is None or not node.orelse:
        return False
    name = _name(site)
    return all(name in _made(arm) for arm in (node.body, node.orelse))


_GROUP_KEYWORDS = frozenset({"group", "pg", "process_group"})
_CREATIONS = frozenset({"new_group", "new_subgroups", "new_subgroups_by_enumeration",
                        "split_group", "init_device_mesh", "DeviceMesh"})


def _statement_at(tree: ast.Module, line: int, kinds: type | tuple[type, ...]) -> ast.AST | None:
    """The statement of ``kinds`` (an ``if``, a ``while``) starting at ``line``: the condition
    a branch names."""
    return next((n for n in ast.walk(tree) if isinstance(n, kinds) and n.lineno == line), None)


def _call_at(tree: ast.Module, site: Site) -> ast.Call | None:
    return next((n for n in ast.walk(tree) if isinstance(n, ast.Call)
                 and (n.lineno, n.col_offset) == (site.line, site.col)), None)


def _local_creation(tree: ast.Module, site: Site) -> bool:
    """``new_group(..., use_local_synchronization=True)``: only the group's members call it
    (torch: the others need not), so a condition choosing the members is right."""
    call = _call_at(tree, site)
    return call is not None and _name(site) == "new_group" and any(
        k.arg == "use_local_synchronization" and isinstance(k.value, ast.Constant)
        and k.value.value is True for k in call.keywords)


def _creation_order(tree: ast.Module, line: int, site: Site) -> tuple[int, int, str] | None:
    """Both arms of the ``if`` at ``line`` create process groups, in a different order (``low,
    high`` on some ranks, ``high, low`` on others): every rank must create every group in the
    same order (each creation is numbered by its order, and a collective of its own). The
    first creation in the ``if``'s body (line, column) and the two orders, or None."""
    if _name(site) not in _CREATIONS:
        return None
    node = _statement_at(tree, line, ast.If)
    if node is None or not node.orelse:
        return None
    arms = [_creations(node.body), _creations(node.orelse)]
    texts = [[t for _, _, t in arm] for arm in arms]
    if not all(texts) or texts[0] == texts[1]:
        return None
    first_line, first_col, _ = arms[0][0]
    return first_line, first_col, " then ".join(texts[0]) + " vs " + " then ".join(texts[1])


def _creations(statements: list[ast.stmt]) -> list[tuple[int, int, str]]:
    """The group creations in ``statements``, in source order: (line, column, the call)."""
    out = []
    for stmt in statements:
        for n in ast.walk(stmt):
            if isinstance(n, ast.Call) and (name := call_name(n)) in _CREATIONS:
                args = ast.unparse(n)[len(ast.unparse(n.func)) + 1:-1]
                out.append((n.lineno, n.col_offset, f"{name}({args})"))
    return sorted(out)


def _members_only(tree: ast.Module, line: int, names: Sequence[str], site: Site) -> bool:
    """The call names a process group (``group=g``) and the condition only asks whether this
    rank is in it - tests the group itself (``if g is not None:``) or a membership (``if rank in
    (0, 2):``): only a group's members make its collectives, which is right."""
    call = _call_at(tree, site)
    if call is None:
        return False
    groups = [k.value for k in call.keywords if k.arg in _GROUP_KEYWORDS
              and not (isinstance(k.value, ast.Constant) and k.value.value is None)]
    if not groups:
        return False
    group_names = {n.id for g in groups for n in ast.walk(g) if isinstance(n, ast.Name)}
    if group_names & {name.split(".")[0] for name in names}:
        return True
    test = getattr(_statement_at(tree, line, (ast.If, ast.While)), "test", None)
    return (isinstance(test, ast.Compare) and len(test.ops) == 1
            and isinstance(test.ops[0], (ast.In, ast.NotIn)))


def _both_leave(tree: ast.Module, line: int) -> bool:
    """Each arm of the rank-dependent ``if`` at ``line`` may leave the function, each under its
    own test of what that side holds (``if rank == 0: if not full: return ... else: if
    placeholder: return ...``): the ways out are written to agree, side by side - read as the
    design, not said (the run still names such a branch when a rank took it)."""
    node = _statement_at(tree, line, ast.If)
    return node is not None and bool(node.orelse) and leaves_function(node.body) \
        and leaves_function(node.orelse)


def _of_members(tree: ast.Module, line: int, site: Site) -> bool:
    """The condition at ``line`` asks whether this rank is in a group or mesh
    (``_rank_not_in_group(pg)``, ``not mesh._is_current_rank_part_of_mesh()``) and the call is
    handed that same group or mesh: only its members make the call, which is right (an early
    way out for the others included)."""
    test = getattr(_statement_at(tree, line, (ast.If, ast.While)), "test", None)
    subjects = set(membership_subjects(test)) if test is not None else set()
    call = _call_at(tree, site) if subjects else None
    if call is None:
        return False
    return any(ast.unparse(n) in subjects for arg in (*call.args, *(k.value for k in call.keywords))
               for n in ast.walk(arg))


def _name(site: Site) -> str:
    return site.call.rpartition(".")[2]


def _made(statements: list[ast.stmt]) -> set[str]:
    """The last names of the calls made in ``statements``."""
    return {name for stmt in statements for node in ast.walk(stmt)
            if isinstance(node, ast.Call) and (name := call_name(node))}


__all__ = ["CheckReport", "check_paths", "collective_of", "python_files"]
