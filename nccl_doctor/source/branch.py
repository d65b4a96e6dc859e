"""The branch on the rank that split the ranks: the rank-dependent conditions around each frame
of a call path (and the rank-dependent jumps before it), found in the frames' Python source.

PARCOACH's idea for MPI - a collective under a condition that depends on the rank is where ranks
part - done with ``ast`` on the one function each frame is in. A may-analysis: it names every
condition that can depend on the rank (``RANK_NAMES``, ``RANK_CALLS``, ``RANK_ENV``, the names a
function derives from them: source/rank_terms.py), not the one that did; the doctor picks
among them with the two sides' paths. Pure: the only input is the ``Sources`` of the report.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass, replace
from typing import Iterator, Optional, Sequence

# RANK_* and rank_like: re-exported (what "depends on the rank" means is asked of this module)
from nccl_doctor.source.rank_terms import (
    RANK_CALLS, RANK_ENV, RANK_NAMES, Deps, rank_like, unique,
)
from nccl_doctor import paths
from nccl_doctor.source.rank_flow import (
    MAX_CALL_DEPTH, bind, call_name, class_of, resolver_for,
)
from nccl_doctor.source.source_text import Region, Sources
from nccl_doctor.location import Location

__all__ = ["Branch", "DataJump", "Loop", "NotAnalysed", "branches", "data_jumps", "loops",
           "rank_like", "RANK_NAMES", "RANK_CALLS", "RANK_ENV"]

TEXT_CHARS = 160
_SCOPES = (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda, ast.ClassDef)
_DEFS = (ast.FunctionDef, ast.AsyncFunctionDef)
_COMPS = (ast.ListComp, ast.SetComp, ast.DictComp, ast.GeneratorExp)
_LOOPS = (ast.For, ast.AsyncFor, ast.While)
_CODE_NAMES: dict[str, type] = {
    "<lambda>": ast.Lambda, "<listcomp>": ast.ListComp, "<setcomp>": ast.SetComp,
    "<dictcomp>": ast.DictComp, "<genexpr>": ast.GeneratorExp,
}


@dataclass(frozen=True)
class Branch:
    kind: str  # if | else | while | for | ifexp | match | comprehension | decorator | jump
    path: str
    line: int  # the condition's line: the if/elif/while header, for "else" the if's header
    text: str  # that line stripped, at most TEXT_CHARS
    function: str
    frame: Location  # the frame whose source showed it
    skips: bool  # "jump": the ranks taking it skip the call ``frame`` is at
    names: tuple[str, ...]  # the rank-dependent names in the test, as written
    # how those of ``names`` that came from another function depend on the rank: a caller's
    # argument, a helper's return, an attribute set elsewhere (source/rank_flow.py)
    via: tuple[str, ...] = ()


@dataclass(frozen=True)
class Loop:
    path: str
    line: int  # the loop's header
    text: str
    function: str
    frame: Location
    first_line: int  # the header: a for's next() and a while's test run every iteration
    last_line: int  # the body's last line (an ``else:`` runs once, after)


@dataclass(frozen=True)
class DataJump:
    """A jump before a frame's call, in the loop that holds it, whose test does not depend on
    the rank (``if not torch.isfinite(loss): continue``): the ranks' data decides who takes it."""
    branch: Branch  # kind "jump", no names
    leaves: str  # continue | break | return | raise
    loop: Loop  # the innermost loop holding the frame's line, the jump inside it


@dataclass(frozen=True)
class NotAnalysed:
    path: str
    why: str


def branches(frames: Sequence[Location], sources: Sources,
             ) -> tuple[tuple[Branch, ...], tuple[NotAnalysed, ...]]:
    """Every rank-dependent branch enclosing or skipping the call, frame by frame (frames
    innermost first), innermost first. NotAnalysed for each distinct file that could not be read
    or parsed."""
    found: dict[tuple[str, int, str], Branch] = {}
    failed: dict[str, NotAnalysed] = {}
    frames = tuple(frames)
    for i, frame in enumerate(frames):
        try:
            view = _view(frame, sources)
            if isinstance(view, str):
                failed.setdefault(frame.path, NotAnalysed(frame.path, view))
                continue
            view = _seeded(view, frames, i, sources)
            for branch in view.branches():
                found.setdefault((branch.path, branch.line, branch.kind), branch)
        except Exception as exc:  # odd source must cost the report this frame, not the report
            failed.setdefault(frame.path, NotAnalysed(
                frame.path, f"analysis failed ({type(exc).__name__}: {exc})"))
    return tuple(found.values()), tuple(failed.values())


def data_jumps(frames: Sequence[Location], sources: Sources) -> tuple[DataJump, ...]:
    """Every jump before a frame's call inside the innermost loop holding it whose test does not
    depend on the rank, frame by frame (innermost first), nearest first; frames whose source is
    not analysed add none."""
    out: list[DataJump] = []
    frames = tuple(frames)
    for i, frame in enumerate(frames):
        try:
            view = _view(frame, sources)
            if isinstance(view, str):
                continue
            out.extend(_seeded(view, frames, i, sources).data_jumps())
        except Exception:  # as in branches(): this frame only
            continue
    return tuple(out)


def loops(frames: Sequence[Location], sources: Sources) -> tuple[Loop, ...]:
    """The innermost loop (for/while/async for) enclosing each frame's line, innermost frame
    first; frames not in a loop, or whose source is not analysed, add none."""
    out: list[Loop] = []
    for frame in frames:
        try:
            view = _view(frame, sources)
            loop = None if isinstance(view, str) else view.loop()
        except Exception:  # as in branches(): this frame only
            loop = None
        if loop is not None:
            out.append(loop)
    return tuple(out)


# -- one frame ---------------------------------------------------------------------------------

# A step down the tree: (parent, field, index in the field's list or None, child).
Step = tuple[ast.AST, str, Optional[int], ast.AST]


@dataclass(frozen=True)
class _View:
    """A frame's line inside the function it runs: the paths from the function to the calls on
    that line."""
    frame: Location
    function: str
    scope: ast.AST
    paths: tuple[tuple[Step, ...], ...]
    deps: Deps
    lines: tuple[str, ...]
    region: Region

    def branches(self) -> Iterator[Branch]:
        for path in self.paths:
            for depth in range(len(path) - 1, -1, -1):
                parent, field, index, child = path[depth]
                if index is not None and isinstance(child, ast.stmt):
                    yield from self._jumps(getattr(parent, field)[:index])
                yield from self._enclosing(path, depth)
        if isinstance(self.scope, (*_DEFS, ast.ClassDef)):
            for decorator in self.scope.decorator_list:
                names = self.deps.names(decorator)
                if names:
                    yield self._branch("decorator", decorator.lineno, names)

    def loop(self) -> Loop | None:
        for path in self.paths[:1]:
            # A frame on a loop's own header is in it too: a for's next() runs there.
            steps = [(parent, field) for parent, field, _, _ in path]
            if path and isinstance(path[-1][3], _LOOPS):
                steps.append((path[-1][3], "header"))
            for parent, field in reversed(steps):
                if isinstance(parent, (ast.For, ast.AsyncFor, ast.While)) and field != "orelse":
                    last = parent.body[-1].end_lineno or parent.lineno
                    return Loop(self.frame.path, parent.lineno, self._text(parent.lineno),
                                self.function, self.frame, parent.lineno, last)
        return None

    def _enclosing(self, path: tuple[Step, ...], depth: int) -> Iterator[Branch]:
        parent, field, index, child = path[depth]
        if isinstance(parent, ast.If) and field in ("body", "orelse"):
            names = self.deps.names(parent.test)
            if names:
                yield self._branch("if" if field == "body" else "else", parent.lineno, names)
        elif isinstance(parent, ast.While) and field == "body":
            names = self.deps.names(parent.test)
            if names:
                yield self._branch("while", parent.lineno, names)
        elif isinstance(parent, (ast.For, ast.AsyncFor)) and field == "body":
            # a loop bound by the rank (``for _ in range(rank + 1):``): each rank its own count
            names = self.deps.names(parent.iter)
            if names:
                yield self._branch("for", parent.lineno, names)
        elif isinstance(parent, ast.IfExp) and field in ("body", "orelse"):
            names = self.deps.names(parent.test)
            if names:
                yield self._branch("ifexp", parent.test.lineno, names)
        elif isinstance(parent, ast.Match) and field == "cases":
            inner = path[depth + 1][1] if depth + 1 < len(path) else ""
            case = child
            # in the case's body, not its guard or pattern: those run on every rank
            if isinstance(case, ast.match_case) and inner == "body":
                subject = self.deps.names(parent.subject)
                own = self.deps.names(case.guard) if case.guard is not None else ()
                for value in ast.walk(case.pattern):
                    if isinstance(value, ast.MatchValue):
                        own += self.deps.names(value.value)
                if subject or own:
                    line = parent.lineno if subject else case.pattern.lineno
                    yield self._branch("match", line, unique(subject + own))
        elif isinstance(parent, _COMPS):
            generators: list[ast.comprehension] = parent.generators
            if field == "generators" and index is not None:
                inner = path[depth + 1] if depth + 1 < len(path) else None
                before = [g.ifs for g in generators[:index]]
                if inner is not None and inner[1] == "ifs" and inner[2] is not None:
                    before.append(generators[index].ifs[:inner[2]])
            elif field == "generators":
                before = []
            else:  # the element: every filter was passed
                before = [g.ifs for g in generators]
            for test in reversed([t for ifs in before for t in ifs]):
                names = self.deps.names(test)
                if names:
                    yield self._branch("comprehension", test.lineno, names)

    def _jumps(self, statements: Sequence[ast.stmt]) -> Iterator[Branch]:
        """Rank-dependent ifs among ``statements`` (which run before the frame's line) holding a
        return or raise, or a continue/break of a loop that holds the line; nearest first."""
        found: list[Branch] = []
        for node, own_loop in _walk_statements(statements, own_loop=True):
            if isinstance(node, ast.If) and _leaving(node.body + node.orelse, own_loop):
                names = self.deps.names(node.test)
                if names:
                    found.append(self._branch("jump", node.lineno, names, skips=True))
        yield from sorted(found, key=lambda b: -b.line)

    def calls(self, name: str) -> list[ast.Call]:
        """The calls on the frame's line of a function named ``name`` (``share(...)``,
        ``obj.share(...)``): found on the paths down to the line, not by walking the scope."""
        out: list[ast.Call] = []
        for path in self.paths:
            for _, _, _, child in path:
                if isinstance(child, ast.Call) and call_name(child) == name \
                        and all(c is not child for c in out):
                    out.append(child)
        return out

    def data_jumps(self) -> Iterator[DataJump]:
        """The ifs among the statements before the frame's line, inside the innermost loop
        holding it, that leave it (or the function) and whose test does not read the rank."""
        loop = self.loop()
        if loop is None:
            return
        found: dict[int, DataJump] = {}
        for path in self.paths[:1]:
            for depth in range(len(path) - 1, -1, -1):
                parent, field, index, child = path[depth]
                if index is None or not isinstance(child, ast.stmt):
                    continue
                before = getattr(parent, field)[:index]
                for node, own_loop in _walk_statements(before, own_loop=True):
                    if not isinstance(node, ast.If) or node.lineno < loop.first_line \
                            or node.lineno in found:
                        continue
                    leaves = _leaving(node.body + node.orelse, own_loop)
                    if leaves is not None and not self.deps.names(node.test):
                        found[node.lineno] = DataJump(
                            self._branch("jump", node.lineno, (), skips=True), leaves, loop)
        yield from sorted(found.values(), key=lambda j: -j.branch.line)

    def _branch(self, kind: str, line: int, names: tuple[str, ...],
                skips: bool = False) -> Branch:
        return Branch(kind, self.frame.path, line, self._text(line), self.function, self.frame,
                      skips, names, self.deps.via(names))

    def _text(self, line: int) -> str:
        text = self.lines[line - 1].strip() if 0 < line <= len(self.lines) else ""
        return text if len(text) <= TEXT_CHARS else text[:TEXT_CHARS - 3] + "..."


def _view(frame: Location, sources: Sources) -> _View | str:
    """The frame's function and the paths down to its line, or why not; once per report."""
    view = sources.memo(("branch.view", frame.path, frame.line, frame.function),
                        lambda: _make_view(frame, sources))
    # Equal frames may differ in what the recorder saw of them: name the one given.
    return view if isinstance(view, str) or view.frame is frame else replace(view, frame=frame)


def _make_view(frame: Location, sources: Sources) -> _View | str:
    qualname = frame.function or ""
    parts = qualname.split(".")
    # The outermost function of the qualname: its text holds any closure the frame reads.
    named = parts[:parts.index("<locals>")] if "<locals>" in parts else parts
    outer = named[-1] if named and named[-1].isidentifier() else None
    region = sources.region(frame.path, frame.line, outer)
    if isinstance(region, str):
        return region
    lines = sources.lines(frame.path)
    scope = _scope(region.node, frame.line, parts[-1])
    paths = _paths(scope, frame.line)
    deps = sources.memo(("branch.deps", frame.path, id(region.node), qualname),
                        lambda: Deps.of(region, sources,
                                        resolver=resolver_for(sources, frame.path, qualname)))
    function = qualname or getattr(scope, "name", "<module>")
    return _View(frame, function, scope, paths, deps, lines, region)


# -- across calls ------------------------------------------------------------------------------

def _seeded(view: _View, frames: tuple[Location, ...], i: int, sources: Sources,
            depth: int = MAX_CALL_DEPTH) -> _View:
    """The frame's view with the parameters its caller (the next frame out) passed
    rank-derived arguments to read as the rank's."""
    seeds = _seeds(frames, i, sources, depth)
    if not seeds:
        return view
    frame = view.frame
    key = tuple(sorted(seeds.items()))
    deps = sources.memo(("branch.seeded", frame.path, id(view.region.node), view.function, key),
                        lambda: Deps.of(view.region, sources, seeds,
                                        resolver_for(sources, frame.path, view.function)))
    return replace(view, deps=deps)


def _seeds(frames: tuple[Location, ...], i: int, sources: Sources, depth: int,
           ) -> dict[str, str]:
    """Parameter -> how its argument depends on the rank, for the parameters of ``frames[i]``'s
    function that its caller gave a rank-derived argument. The caller is the next frame out of
    the user's whose line calls the function by name (a pass-through wrapper between may be
    skipped); its own parameters are followed ``depth`` callers out."""
    if depth <= 0 or i + 1 >= len(frames):
        return {}
    key = ("branch.seeds", depth, tuple((f.path, f.line, f.function)
                                        for f in frames[i:i + depth + 2]))
    return sources.memo(key, lambda: _find_seeds(frames, i, sources, depth))


def _find_seeds(frames: tuple[Location, ...], i: int, sources: Sources, depth: int,
                ) -> dict[str, str]:
    if paths.is_internal_file(frames[i].path):
        return {}  # torch's own parameters (a group, a src) say nothing of a branch of yours
    view = _view(frames[i], sources)
    if isinstance(view, str) or not isinstance(view.scope, _DEFS):
        return {}
    name = view.scope.name
    if name == "__init__":  # called as its class: ``Worker(rank == 0)``
        name = class_of(view.function) or name
    for j in range(i + 1, min(i + 3, len(frames))):
        caller = frames[j]
        if not paths.is_user_file(caller.path):
            continue  # a library's frame (a wrapper passing the call on): the user's is next
        outer = _view(caller, sources)
        if isinstance(outer, str):
            return {}
        calls = outer.calls(name)
        if not calls:
            continue
        more = _seeds(frames, j, sources, depth - 1)
        deps = _seeded(outer, frames, j, sources, depth - 1).deps if more else outer.deps
        out: dict[str, str] = {}
        for call in calls:
            for param, argument in bind(call, view.scope).items():
                if param not in out and deps.derives(argument):
                    # and how the argument itself came from the rank, when from further off
                    further = deps.via(deps.names(argument))
                    out[param] = "; ".join((f"`{param}` is `{deps.text(argument)}`, passed at "
                                            f"{paths.short_path(caller.path)}:{caller.line}",
                                            *further))
        return out
    return {}


def _span(node: ast.AST) -> tuple[int, int]:
    first = getattr(node, "lineno", None)
    if first is None:
        return 0, 1 << 30  # no position (arguments, comprehension, match_case): look inside
    for decorator in getattr(node, "decorator_list", ()):
        first = min(first, decorator.lineno)
    return first, getattr(node, "end_lineno", None) or first


def _scope(root: ast.AST, line: int, code_name: str) -> ast.AST:
    """The code object the frame runs: the innermost def/class/lambda/comprehension holding
    ``line`` whose name is the frame's, else the innermost def holding it, else ``root``."""
    kind = _CODE_NAMES.get(code_name)

    def named(node: ast.AST) -> bool:
        if kind is not None:
            return isinstance(node, kind)
        return getattr(node, "name", None) == code_name

    best_named: ast.AST | None = root if named(root) else None
    best_def: ast.AST | None = None
    stack = [root]
    while stack:
        node = stack.pop()
        for child in ast.iter_child_nodes(node):
            first, last = _span(child)
            if not first <= line <= last:
                continue
            stack.append(child)
            if not isinstance(child, (*_SCOPES, *_COMPS)):
                continue
            # The def's own line span (not its decorators): its body runs in its frame.
            own_first = getattr(child, "lineno", 0)
            if not own_first <= line <= (getattr(child, "end_lineno", None) or own_first):
                continue
            if named(child):
                best_named = child
            if isinstance(child, _DEFS):
                best_def = child
    if best_named is not None:
        return best_named
    if code_name == "<module>" or best_def is None:
        return root
    return best_def


def _own_fields(node: ast.AST, scope: ast.AST) -> Iterator[str]:
    """The fields of ``node`` evaluated in the frame of ``scope``: a nested def's decorators and
    defaults are, its body is another frame's."""
    if node is scope:
        if isinstance(node, (*_DEFS, ast.ClassDef, ast.Module)):
            yield "body"
        elif isinstance(node, ast.Lambda):
            yield "body"
        else:
            yield from node._fields
    elif isinstance(node, _DEFS):
        yield from ("decorator_list", "args", "returns")
    elif isinstance(node, ast.ClassDef):
        yield from ("decorator_list", "bases", "keywords")
    elif isinstance(node, ast.Lambda):
        yield "args"
    else:
        yield from node._fields


def _paths(scope: ast.AST, line: int) -> tuple[tuple[Step, ...], ...]:
    """The paths from ``scope`` down to the calls starting on ``line`` (the frame's call is one
    of them); else to the calls spanning it (a continuation line); else to the innermost
    statements holding it (a for's next(), a with's enter)."""
    starting: list[tuple[Step, ...]] = []
    spanning: list[tuple[Step, ...]] = []
    deepest: list[tuple[Step, ...]] = []
    # A module-level function, not a closure calling itself: that would be a reference cycle
    # holding every tree until the cyclic collector runs.
    _visit(scope, (), scope, line, (starting, spanning, deepest))
    if starting:
        return tuple(starting)
    if spanning:
        return (max(spanning, key=len),)
    return tuple(deepest)


def _visit(node: ast.AST, path: tuple[Step, ...], scope: ast.AST, line: int,
           found: tuple[list[tuple[Step, ...]], ...]) -> None:
    starting, spanning, deepest = found
    descended = False
    for field in _own_fields(node, scope):
        value = getattr(node, field, None)
        children = value if isinstance(value, list) else [value]
        for index, child in enumerate(children):
            if not isinstance(child, ast.AST):
                continue
            first, last = _span(child)
            if not first <= line <= last:
                continue
            here = path + ((node, field, index if isinstance(value, list) else None, child),)
            if isinstance(child, ast.Call):
                (starting if child.lineno == line else spanning).append(here)
            if isinstance(child, ast.stmt):
                descended = True
            _visit(child, here, scope, line, found)
    if not descended and path and isinstance(path[-1][3], ast.stmt):
        deepest.append(path)


def _walk_statements(statements: Sequence[ast.AST], own_loop: bool,
                     ) -> Iterator[tuple[ast.AST, bool]]:
    """Every statement under ``statements`` in this frame (not in nested defs), with whether a
    continue/break there would leave the loop that holds the frame's line (no loop between)."""
    for node in statements:
        if isinstance(node, (*_DEFS, ast.ClassDef)):
            continue
        yield node, own_loop
        for field in ("body", "orelse", "finalbody", "handlers", "cases"):
            children = getattr(node, field, None)
            if not isinstance(children, list):
                continue
            inner = own_loop and not (isinstance(node, _LOOPS) and field == "body")
            yield from _walk_statements(children, inner)


def _leaving(statements: Sequence[ast.AST], own_loop: bool) -> str | None:
    """The first statement among ``statements`` that leaves the loop holding the frame's line
    or its function: continue, break, return or raise; None if none does."""
    for node, loop in _walk_statements(statements, own_loop):
        if isinstance(node, ast.Return) or (isinstance(node, ast.Raise) and not _asserts(node)) \
                or (isinstance(node, (ast.Continue, ast.Break)) and loop):
            return type(node).__name__.lower()
    return None


def leaves_function(statements: Sequence[ast.AST]) -> bool:
    """Whether ``statements`` may return or raise (an assert written out aside)."""
    return _leaving(statements, own_loop=False) is not None


def _asserts(node: ast.Raise) -> bool:
    """``raise AssertionError(...)``: an assert written out (torch writes its own so, to survive
    ``python -O``) - what its author holds true on every rank, not a way out some ranks take;
    were it false, the rank fails loudly (a crash the launcher ends and the run names)."""
    exc = node.exc.func if isinstance(node.exc, ast.Call) else node.exc
    return isinstance(exc, ast.Name) and exc.id == "AssertionError"
