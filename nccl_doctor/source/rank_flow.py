"""What carries the rank across calls in the user's code: a rank-derived argument bound to a
parameter (``share(x, is_main=(rank == 0))`` then ``if is_main:`` in ``share``), a helper that
returns one (``def is_main(): return dist.get_rank() == 0``), an attribute a method of the class
sets from one (``self.is_main = rank == 0`` in ``__init__``, ``if self.is_main:`` in ``step``),
or a property that returns one.

The callers are the frames the run recorded, so a parameter is followed only along the path the
call really took, and only where the caller is the user's code (a library calling itself is read
by its names alone: what its flags are called says enough, and following its helpers costs a
report the 50 ms it has). Helpers and attributes are looked for in the same file (a file on no
call path has no fingerprint recorded, and is never read). Bounded: ``MAX_CALL_DEPTH`` callers
for one parameter, ``MAX_HELPER_DEPTH`` helpers deep, and per report ``MAX_DEFINITIONS``
definitions parsed and ``BUDGET_S`` seconds spent following; past a bound a value is taken as
not the rank's (the branch finder then names less, never more). Pure but for the clock of the
time bound.
"""

from __future__ import annotations

import ast
import re
import time
import weakref
from dataclasses import dataclass

from nccl_doctor import paths
from nccl_doctor.source.rank_terms import Deps
from nccl_doctor.source.source_text import Region, Sources

__all__ = ["FileResolver", "resolver_for", "call_name", "bind", "class_of",
           "MAX_CALL_DEPTH", "MAX_HELPER_DEPTH", "MAX_DEFINITIONS", "BUDGET_S"]

MAX_CALL_DEPTH = 4  # callers followed out for one parameter
MAX_HELPER_DEPTH = 3  # helper -> helper -> attribute (`self.chief()` returning `self.leads`, a
# property reading `self.me`), no deeper
MAX_DEFINITIONS = 32  # helper and class definitions parsed for following, per report
BUDGET_S = 0.025  # CPU time spent following, per report: a safety net for odd files, never
# reached by the cases the tests and the benchmark hold (about 1 ms). The thread's CPU time, not
# the clock's: on a loaded machine the same source gets the same answer

_DEFS = (ast.FunctionDef, ast.AsyncFunctionDef)
_PROPERTIES = frozenset({"property", "cached_property"})


@dataclass
class _Budget:
    definitions: int = 0
    spent: float = 0.0
    active: int = 0  # following under way (a helper read while reading another is timed once)

    def take(self) -> bool:
        """One more definition may be parsed."""
        if self.definitions >= MAX_DEFINITIONS or self.spent >= BUDGET_S:
            return False
        self.definitions += 1
        return True


def _budget(sources: Sources) -> _Budget:
    return sources.memo(("rank_flow.budget",), _Budget)


def class_of(qualname: str) -> str | None:
    """The class a method's qualified name is in (``Worker.step`` -> ``Worker``)."""
    parts = qualname.split(".")
    if len(parts) >= 2 and parts[-2].isidentifier():
        return parts[-2]
    return None


def resolver_for(sources: Sources, path: str, qualname: str,
                 depth: int = MAX_HELPER_DEPTH) -> FileResolver | None:
    """The resolver of a frame's region: for the user's files only."""
    if depth <= 0 or not path or not paths.is_user_file(path):
        return None
    return FileResolver(sources, path, class_of(qualname), depth)


class FileResolver:
    """The helpers and ``self`` attributes of one file (and class) that carry the rank."""

    def __init__(self, sources: Sources, path: str, class_name: str | None, depth: int) -> None:
        # weak: the resolver lives in the sources' memo (see rank_terms._global_lookup)
        self._sources = weakref.ref(sources)
        self.path = path
        self.class_name = class_name
        self.depth = depth

    def call(self, name: str) -> str | None:
        sources = self._sources()
        if sources is None:
            return None
        return sources.memo(("rank_flow.call", self.path, name, self.depth),
                            lambda: self._timed(sources, lambda: self._returns(sources, name)))

    def attribute(self, name: str) -> str | None:
        sources = self._sources()
        if sources is None:
            return None
        return sources.memo(("rank_flow.attribute", self.path, self.class_name, name,
                             self.depth),
                            lambda: self._timed(sources, lambda: self._attribute(sources, name)))

    # -- following -------------------------------------------------------------------------

    def _timed(self, sources: Sources, work):  # type: ignore[no-untyped-def]
        budget = _budget(sources)
        if budget.spent >= BUDGET_S:
            return None
        if budget.active:
            return work()
        budget.active += 1
        t0 = time.thread_time()
        try:
            return work()
        finally:
            budget.active -= 1
            budget.spent += time.thread_time() - t0

    def _deps(self, sources: Sources, node: ast.AST) -> Deps:
        inner = FileResolver(sources, self.path, self.class_name, self.depth - 1) \
            if self.depth > 1 else None
        return sources.memo(("rank_flow.deps", self.path, id(node), self.depth),
                            lambda: Deps.of(Region(self.path, node, whole_file=False), sources,
                                            resolver=inner))

    def _returns(self, sources: Sources, name: str, property_only: bool = False) -> str | None:
        """How the function ``name`` of this file returns a rank-derived value, or None."""
        for node in _definitions(sources, self.path, name, "def"):
            if property_only and not any(_terminal(d) in _PROPERTIES
                                         for d in node.decorator_list):
                continue
            deps = self._deps(sources, node)
            for value in _returned(node):
                if deps.derives(value):
                    what = f"`self.{name}`" if property_only else f"`{name}()`"
                    return (f"{what} returns `{deps.text(value)}` "
                            f"({paths.short_path(self.path)}:{value.lineno})")
        return None

    def _attribute(self, sources: Sources, name: str) -> str | None:
        """How ``self.name`` gets a rank-derived value: a property returning one, or a method of
        the class assigning one to it."""
        said = self._returns(sources, name, property_only=True)
        if said is not None or self.class_name is None:
            return said
        key = f"self.{name}"
        for cls in _definitions(sources, self.path, self.class_name, "class"):
            for method in cls.body:
                if not isinstance(method, _DEFS):
                    continue
                values = [value for target, value in _self_assignments(method) if target == key]
                if not values:
                    continue
                deps = self._deps(sources, method)
                for value in values:
                    if deps.derives(value):
                        return (f"`{key}` is set to `{deps.text(value)}` in "
                                f"{self.class_name}.{method.name} "
                                f"({paths.short_path(self.path)}:{value.lineno})")
        return None


def _terminal(node: ast.AST) -> str | None:
    if isinstance(node, ast.Call):
        node = node.func
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return node.attr
    return None


def _definitions(sources: Sources, path: str, name: str, keyword: str) -> list[ast.AST]:
    """The definitions (``def`` or ``class``) named ``name`` in ``path``: found by a text search,
    each parsed alone (as a frame's function is), within the report's budget."""
    def find() -> list[ast.AST]:
        text = sources.get(path).text or ""
        if name not in text:
            return []
        pattern = re.compile(rf"^[ \t]*(?:async[ \t]+)?{keyword}[ \t]+{re.escape(name)}\b",
                             re.MULTILINE)
        out: list[ast.AST] = []
        budget = _budget(sources)
        for match in pattern.finditer(text):
            if not budget.take():
                break
            line = text.count("\n", 0, match.start()) + 1
            region = sources.region(path, line, name)
            if isinstance(region, str):
                continue
            node = region.node if not region.whole_file else next(
                (n for n in ast.walk(region.node) if getattr(n, "name", None) == name
                 and getattr(n, "lineno", 0) == line), None)
            wanted = _DEFS if keyword == "def" else (ast.ClassDef,)
            if isinstance(node, wanted):
                out.append(node)
        return out

    return sources.memo(("rank_flow.definitions", path, name, keyword), find)


def _own(node: ast.AST):  # type: ignore[no-untyped-def]
    """The nodes of a function's own code: not nested functions, classes or lambdas."""
    stack = list(ast.iter_child_nodes(node))
    while stack:
        current = stack.pop()
        if isinstance(current, (*_DEFS, ast.ClassDef, ast.Lambda)):
            continue
        yield current
        stack.extend(ast.iter_child_nodes(current))


def _returned(function: ast.AST) -> list[ast.expr]:
    return [n.value for n in _own(function) if isinstance(n, ast.Return) and n.value is not None]


def _self_assignments(method: ast.AST) -> list[tuple[str, ast.expr]]:
    out: list[tuple[str, ast.expr]] = []
    for node in _own(method):
        if isinstance(node, ast.Assign):
            targets, value = node.targets, node.value
        elif isinstance(node, (ast.AnnAssign, ast.AugAssign)) and node.value is not None:
            targets, value = [node.target], node.value
        else:
            continue
        for target in targets:
            if isinstance(target, ast.Attribute) and isinstance(target.value, ast.Name) \
                    and target.value.id == "self":
                out.append((f"self.{target.attr}", value))
    return out


# -- arguments ---------------------------------------------------------------------------------

def call_name(call: ast.Call) -> str | None:
    """The name a call calls: ``share`` of ``share(...)`` and of ``obj.share(...)``."""
    return _terminal(call.func)


def bind(call: ast.Call, function: ast.AST) -> dict[str, ast.expr]:
    """Parameter -> the argument expression ``call`` gives it, for what can be bound without
    running anything: positional arguments before any ``*args``, keywords by name; a method's
    ``self``/``cls`` takes no argument of an attribute call (``obj.share(x)``) or a class's
    (``Worker(x)`` calling ``__init__``)."""
    if not isinstance(function, _DEFS):
        return {}
    arguments = function.args
    positional = [a.arg for a in (*arguments.posonlyargs, *arguments.args)]
    if positional and positional[0] in ("self", "cls") and (
            isinstance(call.func, ast.Attribute) or function.name == "__init__"):
        positional = positional[1:]
    out: dict[str, ast.expr] = {}
    for param, arg in zip(positional, call.args):
        if isinstance(arg, ast.Starred):
            break
        out[param] = arg
    named = {a.arg for a in (*arguments.args, *arguments.kwonlyargs)}
    for keyword in call.keywords:
        if keyword.arg is not None and keyword.arg in named:
            out[keyword.arg] = keyword.value
    return out
