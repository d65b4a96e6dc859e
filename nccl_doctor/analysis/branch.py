"""The branch on the rank that split the ranks: the rank-dependent conditions around each frame
of a call path (and the rank-dependent jumps before it), found in the frames' Python source.

PARCOACH's idea for MPI - a collective under a condition that depends on the rank is where ranks
part - done with ``ast`` on the one function each frame is in. A may-analysis: it names every
condition that can depend on the rank (``RANK_NAMES``, ``RANK_CALLS``, ``RANK_ENV``, the names a
function derives from them), not the one that did; the doctor picks among them with the two
sides' paths. Pure: the only input is the ``Sources`` of the report.
"""

from __future__ import annotations

import ast
import re
import weakref
from dataclasses import dataclass, replace
from typing import Callable, Iterator, Optional, Sequence

from nccl_doctor.analysis.source_text import Region, Sources
from nccl_doctor.location import Location

__all__ = ["Branch", "Loop", "NotAnalysed", "branches", "loops", "rank_like",
           "RANK_NAMES", "RANK_CALLS", "RANK_ENV"]

# Names and attributes that hold a rank or a test of it (torch, Lightning, accelerate, HF Trainer).
RANK_NAMES = frozenset({
    "rank", "local_rank", "global_rank", "node_rank", "group_rank", "process_index",
    "local_process_index", "is_main_process", "is_local_main_process", "is_global_zero",
    "is_world_process_zero", "is_local_process_zero",
})
# Functions whose result is the rank or a test of it, called bare or as an attribute.
RANK_CALLS = frozenset({
    "get_rank", "get_local_rank", "get_global_rank", "get_node_local_rank", "is_main_process",
    "is_world_process_zero", "is_local_process_zero",
})
# Environment variables that hold the rank (torchrun, SLURM, Open MPI, PMI).
RANK_ENV = frozenset({
    "RANK", "LOCAL_RANK", "NODE_RANK", "GROUP_RANK", "ROLE_RANK", "SLURM_PROCID",
    "SLURM_LOCALID", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_LOCAL_RANK", "PMI_RANK",
})
TEXT_CHARS = 160
_GLOBAL_DEPTH = 3  # module-level names derived from names derived from ... the rank
# Builtins through which a value stays the rank's (``is_master = int(rank) == 0``).
_CONVERSIONS = frozenset({"int", "bool", "str", "float", "abs", "min", "max", "divmod", "round"})

_WORDS = re.compile(r"[A-Z]?[a-z0-9]+|[A-Z0-9]+(?![a-z])")
_RANK_WORD = re.compile(r"rank\d*")
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
    kind: str  # if | else | while | ifexp | match | comprehension | decorator | jump
    path: str
    line: int  # the condition's line: the if/elif/while header, for "else" the if's header
    text: str  # that line stripped, at most TEXT_CHARS
    function: str
    frame: Location  # the frame whose source showed it
    skips: bool  # "jump": the ranks taking it skip the call ``frame`` is at
    names: tuple[str, ...]  # the rank-dependent names in the test, as written


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
class NotAnalysed:
    path: str
    why: str


def rank_like(identifier: str) -> bool:
    """Whether a name or attribute holds a rank by its name: ``RANK_NAMES``, any ``rank_zero``,
    or ``rank`` (``rank0``) as one of its words (ddp_rank, tpRank, RANK_ID; not ranks)."""
    low = identifier.lower()
    if low in RANK_NAMES or "rank_zero" in low or "rankzero" in low:
        return True
    return any(_RANK_WORD.fullmatch(w.lower()) for w in _WORDS.findall(identifier))


def branches(frames: Sequence[Location], sources: Sources,
             ) -> tuple[tuple[Branch, ...], tuple[NotAnalysed, ...]]:
    """Every rank-dependent branch enclosing or skipping the call, frame by frame (frames
    innermost first), innermost first. NotAnalysed for each distinct file that could not be read
    or parsed."""
    found: dict[tuple[str, int, str], Branch] = {}
    failed: dict[str, NotAnalysed] = {}
    for frame in frames:
        try:
            view = _view(frame, sources)
            if isinstance(view, str):
                failed.setdefault(frame.path, NotAnalysed(frame.path, view))
                continue
            for branch in view.branches():
                found.setdefault((branch.path, branch.line, branch.kind), branch)
        except Exception as exc:  # odd source must cost the report this frame, not the report
            failed.setdefault(frame.path, NotAnalysed(
                frame.path, f"analysis failed ({type(exc).__name__}: {exc})"))
    return tuple(found.values()), tuple(failed.values())


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
    deps: _Deps
    lines: tuple[str, ...]

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
                    yield self._branch("match", line, _unique(subject + own))
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
            if isinstance(node, ast.If) and _leaves(node.body + node.orelse, own_loop):
                names = self.deps.names(node.test)
                if names:
                    found.append(self._branch("jump", node.lineno, names, skips=True))
        yield from sorted(found, key=lambda b: -b.line)

    def _branch(self, kind: str, line: int, names: tuple[str, ...],
                skips: bool = False) -> Branch:
        return Branch(kind, self.frame.path, line, self._text(line), self.function, self.frame,
                      skips, names)

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
    deps = sources.memo(("branch.deps", frame.path, id(region.node)),
                        lambda: _Deps(_Facts.of(region, sources)))
    function = qualname or getattr(scope, "name", "<module>")
    return _View(frame, function, scope, paths, deps, lines)


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


def _leaves(statements: Sequence[ast.AST], own_loop: bool) -> bool:
    """Whether ``statements`` hold a return or raise, or a continue/break of the loop holding
    the frame's line."""
    for node, loop in _walk_statements(statements, own_loop):
        if isinstance(node, (ast.Return, ast.Raise)):
            return True
        if isinstance(node, (ast.Continue, ast.Break)) and loop:
            return True
    return False


def _unique(names: tuple[str, ...]) -> tuple[str, ...]:
    return tuple(dict.fromkeys(names))


# -- what depends on the rank ------------------------------------------------------------------

def _dotted(node: ast.AST) -> str | None:
    """``a.b.c`` for a chain of names and attributes, else None."""
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        base = _dotted(node.value)
        return None if base is None else f"{base}.{node.attr}"
    return None


def _terminal(node: ast.AST) -> str | None:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return node.attr
    return None


def _env_key(node: ast.AST) -> str | None:
    """The variable an environment lookup reads: os.environ[K], environ.get(K), os.getenv(K)."""
    key: ast.AST | None = None
    if isinstance(node, ast.Subscript) and _terminal(node.value) == "environ":
        key = node.slice
    elif isinstance(node, ast.Call) and node.args:
        func = node.func
        if _terminal(func) == "getenv" or (
                isinstance(func, ast.Attribute) and func.attr == "get"
                and _terminal(func.value) == "environ"):
            key = node.args[0]
    if isinstance(key, ast.Constant) and isinstance(key.value, str):
        return key.value
    return None


def _env_rank(name: str) -> bool:
    return name in RANK_ENV or "RANK" in name.split("_")


class _Facts:
    """What one region's own code says about names, each worked out on first use: most
    conditions depend on the rank by name, or not at all, and never need it."""

    def __init__(self, root: ast.AST | None, lines: tuple[str, ...],
                 is_global: Callable[[str], bool]) -> None:
        self.root = root
        self.lines = lines
        self.is_global = is_global
        self._tainted: frozenset[str] | None = None
        self._local: frozenset[str] | None = None

    @classmethod
    def of(cls, region: Region, sources: Sources) -> _Facts:
        lines = sources.lines(region.path)
        if region.whole_file:  # the module's own assignments are the region's
            return cls(region.node, lines, lambda name: False)
        return cls(region.node, lines, _global_lookup(region.path, sources, _GLOBAL_DEPTH))

    def tainted(self) -> frozenset[str]:
        """The names assigned from the rank anywhere in the region (flow-insensitive, to a
        fixpoint; nested functions included, for their closures)."""
        if self._tainted is None:
            assignments = _assignments(self.root, self.lines) if self.root is not None else []
            tainted: set[str] = set()
            changed = True
            while changed:
                changed = False
                for key, value in assignments:
                    if key not in tainted and _Deps(self, frozenset(tainted)).derives(value):
                        tainted.add(key)
                        changed = True
            self._tainted = frozenset(tainted)
        return self._tainted

    def local(self) -> frozenset[str]:
        """Names bound anywhere in the region: not the module's."""
        if self._local is None:
            self._local = frozenset(_bound_names(self.root)) if self.root is not None \
                else frozenset()
        return self._local


class _Deps:
    """Which expressions of one region depend on the rank: by name, and by the names the region
    assigns from such expressions (``tainted``: given while working those out)."""

    def __init__(self, facts: _Facts, tainted: frozenset[str] | None = None) -> None:
        self.facts = facts
        self.lines = facts.lines
        self._tainted = tainted

    @property
    def tainted(self) -> frozenset[str]:
        return self._tainted if self._tainted is not None else self.facts.tainted()

    def names(self, node: ast.AST) -> tuple[str, ...]:
        """The rank-dependent names in ``node`` as written; empty when it does not depend on the
        rank."""
        found: list[str] = []
        stack: list[tuple[ast.AST, bool]] = [(node, True)]
        while stack:
            current, value = stack.pop()
            if self._matches(current, value):
                found.append(self._source(current))
                continue
            children = list(ast.iter_child_nodes(current))
            # A called function or an attribute's object is no value of the module's to look
            # up (is_torch_xla_available(), torch.cuda): that skips most module lookups.
            held = {id(current.func)} if isinstance(current, ast.Call) else \
                {id(current.value)} if isinstance(current, ast.Attribute) else set()
            stack.extend((child, id(child) not in held) for child in reversed(children))
        return _unique(tuple(found))

    def derives(self, node: ast.AST) -> bool:
        """Whether ``node``'s value is computed from the rank: a rank-dependent name, call or
        lookup, through comparisons, arithmetic, boolean logic, conditional expressions and
        conversions. Not any value that mentions one: ``model.to(local_rank)``,
        ``torch.device("cuda", local_rank)`` or ``f"rng_{rank}.pth"`` hold the same answer to
        every test on every rank, and taking them made conditions like ``if model is None:``
        rank-dependent all over transformers' Trainer."""
        if self._matches(node):
            return True
        if isinstance(node, ast.BoolOp):
            return any(self.derives(v) for v in node.values)
        if isinstance(node, ast.BinOp):
            return self.derives(node.left) or self.derives(node.right)
        if isinstance(node, ast.UnaryOp):
            return self.derives(node.operand)
        if isinstance(node, ast.Compare):
            return self.derives(node.left) or any(self.derives(c) for c in node.comparators)
        if isinstance(node, ast.IfExp):
            return any(self.derives(n) for n in (node.test, node.body, node.orelse))
        if isinstance(node, ast.NamedExpr):
            return self.derives(node.value)
        if isinstance(node, (ast.Tuple, ast.List)):  # unpacked whole: any element
            return any(self.derives(n) for n in node.elts)
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) \
                and node.func.id in _CONVERSIONS:
            return any(self.derives(n) for n in node.args)
        return False

    def _matches(self, node: ast.AST, value: bool = True) -> bool:
        if isinstance(node, ast.Call):
            name = _terminal(node.func)
            if name is not None and (name in RANK_CALLS or rank_like(name)):
                return True
            if name == "getattr" and len(node.args) >= 2:  # getattr(args, "local_rank", -1)
                attribute = node.args[1]
                if isinstance(attribute, ast.Constant) and isinstance(attribute.value, str) \
                        and rank_like(attribute.value):
                    return True
            key = _env_key(node)
            return key is not None and _env_rank(key)
        if isinstance(node, ast.Subscript):
            key = _env_key(node)
            return key is not None and _env_rank(key)
        if isinstance(node, ast.Name):
            return rank_like(node.id) or node.id in self.tainted or (
                value and self.facts.is_global(node.id) and node.id not in self.facts.local())
        if isinstance(node, ast.Attribute):
            return rank_like(node.attr) or _dotted(node) in self.tainted
        return False

    def _source(self, node: ast.AST) -> str:
        """The node's text as written when on one line, else unparsed."""
        line, end = getattr(node, "lineno", 0), getattr(node, "end_lineno", 0)
        if line == end and 0 < line <= len(self.lines):
            raw = self.lines[line - 1].encode()  # ast columns count UTF-8 bytes
            start, stop = getattr(node, "col_offset", 0), getattr(node, "end_col_offset", None)
            text = raw[start:stop].decode(errors="replace")
            if text:
                return text
        return ast.unparse(node)


def _targets(target: ast.AST, value: ast.AST | None) -> Iterator[tuple[str, ast.AST]]:
    """(name, the expression it gets) for an assignment target: tuples element by element when
    the value is a tuple of the same shape, else every name gets the whole value."""
    if isinstance(target, (ast.Tuple, ast.List)):
        if isinstance(value, (ast.Tuple, ast.List)) and len(value.elts) == len(target.elts) \
                and not any(isinstance(e, ast.Starred) for e in (*target.elts, *value.elts)):
            for t, v in zip(target.elts, value.elts):
                yield from _targets(t, v)
        else:
            for t in target.elts:
                yield from _targets(t, value)
    elif isinstance(target, ast.Starred):
        yield from _targets(target.value, value)
    elif value is not None:
        key = _dotted(target)
        if key is not None:
            yield key, value


def _assignments(root: ast.AST, lines: tuple[str, ...]) -> list[tuple[str, ast.AST]]:
    """(name, the expression assigned to it) for every assignment under ``root``: statements
    only (a fifth of the nodes), and a walrus's wherever the text has one."""
    out: list[tuple[str, ast.AST]] = []
    stack = [root]
    while stack:
        node = stack.pop()
        if isinstance(node, ast.Assign):
            for target in node.targets:
                out.extend(_targets(target, node.value))
        elif isinstance(node, (ast.AnnAssign, ast.AugAssign)) and node.value is not None:
            out.extend(_targets(node.target, node.value))
        for field in ("body", "orelse", "finalbody", "handlers", "cases"):
            children = getattr(node, field, None)
            if isinstance(children, list):
                stack.extend(children)
    first, last = getattr(root, "lineno", 1), getattr(root, "end_lineno", None) or len(lines)
    if any(":=" in text for text in lines[first - 1:last]):
        for node in ast.walk(root):
            if isinstance(node, ast.NamedExpr):
                out.extend(_targets(node.target, node.value))
    return out


def _bound_names(root: ast.AST) -> set[str]:
    out: set[str] = set()
    for node in ast.walk(root):
        if isinstance(node, ast.Name) and not isinstance(node.ctx, ast.Load):
            out.add(node.id)
        elif isinstance(node, ast.arg):
            out.add(node.arg)
        elif isinstance(node, (*_DEFS, ast.ClassDef)):
            out.add(node.name)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            out.update((a.asname or a.name).split(".")[0] for a in node.names)
    return out


_MODULE_ASSIGN = re.compile(r"^([A-Za-z_]\w*)[ \t]*(?::[^=\n]*)?=(?!=)", re.MULTILINE)


def _global_lookup(path: str, sources: Sources, depth: int) -> Callable[[str], bool]:
    """Whether a module-level name of ``path`` is assigned from the rank (``IS_MASTER =
    int(os.environ["RANK"]) == 0``): only the statements at column 0 that assign it are
    parsed, and names they use are followed ``depth`` levels."""
    # Held in the sources' memo: a strong reference back would make a cycle, and each report's
    # trees would wait for the cyclic collector (a pause of 0.1 s and more) instead of going
    # when the report drops its Sources.
    weak = weakref.ref(sources)

    def lookup(name: str) -> bool:
        held = weak()
        if depth <= 0 or held is None:
            return False
        return held.memo(("branch.global", path, name, depth), lambda: assigned(held, name))

    def assigned(held: Sources, name: str) -> bool:
        lines = held.lines(path)
        inner = _Deps(_Facts(None, lines, _global_lookup(path, held, depth - 1)))
        for line in _module_assignments(held.get(path).text or "", name):
            for key, value in _statement_assignments(lines, line):
                if key == name and inner.derives(value):
                    return True
        return False

    return lookup


def _module_assignments(text: str, name: str) -> list[int]:
    """The lines where a column-0 statement assigns ``name``: found by a substring search (in
    C), each hit checked by the pattern."""
    out: list[int] = []
    at = 0 if text.startswith(name) else -1
    while True:
        if at >= 0:
            match = _MODULE_ASSIGN.match(text, at)
            if match and match.group(1) == name:
                out.append(text.count("\n", 0, at) + 1)
        found = text.find("\n" + name, at + 1)
        if found < 0:
            return out
        at = found + 1


def _statement_assignments(lines: tuple[str, ...], line: int) -> list[tuple[str, ast.AST]]:
    """The assignments of the column-0 statement starting at ``line`` (its continuation lines
    are indented or close a bracket)."""
    last = line
    while last < len(lines) and last - line < 50 and (
            lines[last][:1] in (" ", "\t", ")", "]", "}") or not lines[last].strip()):
        last += 1
    for end in (last, line):  # the whole statement, else its first line
        try:
            tree = ast.parse("\n" * (line - 1) + "\n".join(lines[line - 1:end]))
            return _assignments(tree, lines[line - 1:end])  # a Module: its text is the slice
        except (SyntaxError, ValueError, RecursionError):
            continue
    return []
