"""What depends on the rank: whether an expression's value can differ from rank to rank, read
from the Python source with ``ast``.

"Depends on the rank" means the names and attributes users write for a rank or a test of it
(``RANK_NAMES``; any name with ``rank`` as a word, ``ddp_rank``, ``tpRank``; any ``rank_zero``),
the calls that return one (``RANK_CALLS``: ``get_rank()`` and its kin), the environment variables
that hold one (``RANK_ENV``: ``RANK``, ``LOCAL_RANK``, ``SLURM_PROCID``, ...), and what a function
or its module computes from them (``is_master = rank == 0`` then ``if is_master:``; a module
constant ``IS_MASTER = int(os.environ["RANK"]) == 0``). A may-analysis, flow-insensitive: a name
ever assigned from the rank depends on it. The finder of the branch on the rank (branch.py) asks
``Deps.names`` which names of a condition these are. Pure: the only input is the ``Sources`` of the
report.
"""

from __future__ import annotations

import ast
import re
import weakref
from typing import Callable, Iterator, Mapping, Protocol

from nccl_doctor.source.source_text import Region, Sources

__all__ = ["Deps", "Resolver", "membership_subjects", "rank_like", "unique", "RANK_NAMES",
           "RANK_CALLS", "RANK_ENV"]

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
# Collectives whose result is the same on every rank, called as a method (``strategy.broadcast(x)``,
# ``strategy.reduce_boolean_decision(found, all=True)``, ``accelerator.gather(t)``): what is
# passed in may differ by rank, what comes back does not.
UNIFORM_CALLS = frozenset({
    "broadcast", "broadcast_object", "reduce_boolean_decision", "all_gather", "gather",
    "gather_for_metrics", "gather_object", "reduce", "all_reduce",
})
_LOCAL_RECEIVERS = frozenset({"torch", "functools", "np", "numpy", "operator"})
_GLOBAL_DEPTH = 3  # module-level names derived from names derived from ... the rank
# Builtins through which a value stays the rank's (``is_master = int(rank) == 0``).
_CONVERSIONS = frozenset({"int", "bool", "str", "float", "abs", "min", "max", "divmod", "round"})

_WORDS = re.compile(r"[A-Z]?[a-z0-9]+|[A-Z0-9]+(?![a-z])")
_RANK_WORD = re.compile(r"rank\d*")


# Words naming *a chosen* rank (the source of a broadcast, the owner of a shard) or a mode that
# says which ranks get a result (``rank0_only``): given alike to every rank, as torch requires of
# ``src``/``dst``/``root`` - not this rank. ``is_src_rank`` (a test of this rank) keeps its ``is``.
# ``per`` names a quantity for each rank (``tokens_per_rank``), alike on every rank.
_DESIGNATING = frozenset({"src", "source", "dst", "dest", "destination", "root", "target",
                          "peer", "owner", "only", "per"})
_TESTING = frozenset({"is", "am", "my", "this", "own", "current", "cur", "local"})


def rank_like(identifier: str) -> bool:
    """Whether a name or attribute holds this rank by its name: ``RANK_NAMES``, any
    ``rank_zero``, or ``rank`` (``rank0``) as one of its words (ddp_rank, tpRank, RANK_ID; not
    ranks) - unless another word says it names a chosen rank or a mode every rank is given alike
    (``src_rank``, ``group_dst_rank``, ``rank0_only``: ``_DESIGNATING``)."""
    low = identifier.lower()
    if low in RANK_NAMES or "rank_zero" in low or "rankzero" in low:
        return True
    words = [w.lower() for w in _WORDS.findall(identifier)]
    if not any(_RANK_WORD.fullmatch(w) for w in words):
        return False
    return not (_DESIGNATING.intersection(words) and not _TESTING.intersection(words))


def unique(names: tuple[str, ...]) -> tuple[str, ...]:
    """``names`` without repeats, in their first order."""
    return tuple(dict.fromkeys(names))


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


class Resolver(Protocol):
    """What a region's calls and ``self`` attributes carry from elsewhere in its file (the
    helpers it calls, the methods that set an attribute: source/rank_flow.py): an account of
    how the value comes from the rank ("`is_main()` returns `dist.get_rank() == 0` (train.py:12)"),
    or None when it does not."""

    def call(self, name: str) -> str | None: ...

    def attribute(self, name: str) -> str | None: ...


class _Facts:
    """What one region's own code says about names, each worked out on first use: most
    conditions depend on the rank by name, or not at all, and never need it.

    ``seeds``: names bound from the rank outside the region (a parameter its caller passed a
    rank-derived argument), with how; ``resolver``: what its calls and attributes carry."""

    def __init__(self, root: ast.AST | None, lines: tuple[str, ...],
                 is_global: Callable[[str], bool], seeds: Mapping[str, str] | None = None,
                 resolver: Resolver | None = None) -> None:
        self.root = root
        self.lines = lines
        self.is_global = is_global
        self.seeds: Mapping[str, str] = seeds or {}
        self.resolver = resolver
        # the names and attributes found through ``seeds`` or ``resolver``, as written -> how
        self.via: dict[str, str] = {}
        self._tainted: frozenset[str] | None = None
        self._local: frozenset[str] | None = None
        self._assignments: list[tuple[str, ast.AST]] | None = None

    @classmethod
    def of(cls, region: Region, sources: Sources, seeds: Mapping[str, str] | None = None,
           resolver: Resolver | None = None) -> _Facts:
        lines = sources.lines(region.path)
        if region.whole_file:  # the module's own assignments are the region's
            return cls(region.node, lines, lambda name: False, seeds, resolver)
        return cls(region.node, lines, _global_lookup(region.path, sources, _GLOBAL_DEPTH),
                   seeds, resolver)

    def tainted(self) -> frozenset[str]:
        """The names assigned from the rank anywhere in the region (flow-insensitive, to a
        fixpoint; nested functions included, for their closures), and the seeds."""
        if self._tainted is None:
            assignments = self.assignments()
            tainted: set[str] = set(self.seeds)
            changed = True
            while changed:
                changed = False
                for key, value in assignments:
                    if key not in tainted and Deps(self, frozenset(tainted)).derives(value):
                        tainted.add(key)
                        changed = True
            self._tainted = frozenset(tainted)
        return self._tainted

    def assignments(self) -> list[tuple[str, ast.AST]]:
        """(name, the expression assigned to it) for every assignment in the region, read
        once."""
        if self._assignments is None:
            self._assignments = _assignments(self.root, self.lines) \
                if self.root is not None else []
        return self._assignments

    def local(self) -> frozenset[str]:
        """Names bound anywhere in the region: not the module's."""
        if self._local is None:
            self._local = frozenset(_bound_names(self.root)) if self.root is not None \
                else frozenset()
        return self._local


class Deps:
    """Which expressions of one region depend on the rank: by name, and by the names the region
    assigns from such expressions (``tainted``: given while working those out)."""

    def __init__(self, facts: _Facts, tainted: frozenset[str] | None = None) -> None:
        self.facts = facts
        self.lines = facts.lines
        self._tainted = tainted

    @classmethod
    def of(cls, region: Region, sources: Sources, seeds: Mapping[str, str] | None = None,
           resolver: Resolver | None = None) -> Deps:
        """The region's: what its own code says, and (for a function) its module's constants;
        with ``seeds`` and ``resolver``, what its caller and its file carry into it."""
        return cls(_Facts.of(region, sources, seeds, resolver))

    def via(self, names: tuple[str, ...]) -> tuple[str, ...]:
        """How each of ``names`` (as ``names()`` gives them) that came from another function
        depends on the rank; the others say nothing."""
        seeds, found = self.facts.seeds, self.facts.via
        return unique(tuple(found.get(n) or seeds.get(n) or "" for n in names if
                            found.get(n) or seeds.get(n)))

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
            if _uniform(current) or _unset_or_world(current):
                continue  # (its result is the same on every rank, whatever it was passed)
            if self._matches(current, value):
                if not self._made_uniform(current):
                    found.append(self._source(current))
                continue
            children = list(ast.iter_child_nodes(current))
            # A called function or an attribute's object is no value of the module's to look
            # up (is_torch_xla_available(), torch.cuda): that skips most module lookups.
            held = {id(current.func)} if isinstance(current, ast.Call) else \
                {id(current.value)} if isinstance(current, ast.Attribute) else set()
            stack.extend((child, id(child) not in held) for child in reversed(children))
        return unique(tuple(found))

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
            if _unset_or_world(node):
                return False
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

    def _made_uniform(self, node: ast.AST) -> bool:
        """``node`` is a name the rank reached only through an assignment, and the last one
        before it (by line, in the region) makes it the same on every rank: ``found =
        strategy.broadcast(found)`` after ``found = ... if is_global_zero else False``."""
        if not isinstance(node, ast.Name) or rank_like(node.id) or self.facts.root is None \
                or node.id not in self.tainted or node.id in self.facts.seeds:
            return False
        before = [v for k, v in self.facts.assignments()
                  if k == node.id and getattr(v, "lineno", 0) < getattr(node, "lineno", 0)]
        return bool(before) and _uniform(max(before, key=lambda v: v.lineno))

    def _matches(self, node: ast.AST, value: bool = True) -> bool:
        if isinstance(node, ast.Call):
            name = _terminal(node.func)
            if _rank_term(name):
                return True
            if name == "getattr" and len(node.args) >= 2:  # getattr(args, "local_rank", -1)
                attribute = node.args[1]
                if isinstance(attribute, ast.Constant) and isinstance(attribute.value, str) \
                        and rank_like(attribute.value):
                    return True
            key = _env_key(node)
            if key is not None:
                return _env_rank(key)
            return name is not None and self._resolved(node, self.facts.resolver, "call", name)
        if isinstance(node, ast.Subscript):
            key = _env_key(node)
            return key is not None and _env_rank(key)
        if isinstance(node, ast.Name):
            return rank_like(node.id) or node.id in self.tainted or (
                value and self.facts.is_global(node.id) and node.id not in self.facts.local())
        if isinstance(node, ast.Attribute):
            if rank_like(node.attr) or _dotted(node) in self.tainted:
                return True
            # ``self.is_main``, set from the rank in another method of the class
            return isinstance(node.value, ast.Name) and node.value.id == "self" and \
                self._resolved(node, self.facts.resolver, "attribute", node.attr)
        return False

    def _resolved(self, node: ast.AST, resolver: Resolver | None, how: str, name: str) -> bool:
        """Whether the resolver says ``node`` (a call of ``name``, a ``self.name``) carries the
        rank; its account kept under the node's text."""
        if resolver is None:
            return False
        said = resolver.call(name) if how == "call" else resolver.attribute(name)
        if said is None:
            return False
        self.facts.via.setdefault(self._source(node), said)
        return True

    def text(self, node: ast.AST) -> str:
        """The node's text as written (``names`` gives names so)."""
        return self._source(node)

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


# ``rank OP value`` that only asks whether there is a rank at all: -1 is torch's and HF's "not in
# the group" / "not distributed" (``get_rank(g) > -1``, ``local_rank == -1``, ``rank >= 0``).
_SET_TESTS = {(ast.Gt, -1), (ast.GtE, 0), (ast.Eq, -1), (ast.NotEq, -1), (ast.Lt, 0),
              (ast.LtE, -1)}

# Word pairs naming a test of this rank's membership (``_rank_not_in_group(g)``,
# ``mesh._is_current_rank_part_of_mesh()``, ``is_member(g)``).
_MEMBERSHIP = ({"in", "group"}, {"in", "mesh"}, {"part", "of"}, {"member"}, {"membership"})


def membership_subjects(test: ast.AST) -> tuple[str, ...]:
    """The groups or meshes (as written) a condition asks whether this rank belongs to - every
    part of it such a test, under ``not``, ``and``, ``or`` - else ().

    Only a group's members make its collectives, so a way out for the ranks outside a group
    before one of that group's collectives splits nobody."""
    if isinstance(test, ast.UnaryOp) and isinstance(test.op, ast.Not):
        return membership_subjects(test.operand)
    if isinstance(test, ast.BoolOp):
        parts = [membership_subjects(v) for v in test.values]
        return unique(tuple(t for p in parts for t in p)) if all(parts) else ()
    grouped = _set_test(test)
    if grouped is not None:  # (``get_rank(g) < 0``; a rank with no group: every rank's alike)
        return tuple(ast.unparse(a) for a in (*grouped.args, *(k.value for k in grouped.keywords))
                     ) if isinstance(grouped, ast.Call) else ()
    if not isinstance(test, ast.Call):
        return ()
    name = _terminal(test.func)
    words = {w.lower() for w in _WORDS.findall(name or "")}
    if not any(pair <= words for pair in _MEMBERSHIP):
        return ()
    subjects = [ast.unparse(a) for a in (*test.args, *(k.value for k in test.keywords))]
    if isinstance(test.func, ast.Attribute):
        subjects.append(ast.unparse(test.func.value))
    return unique(tuple(subjects))


def _set_test(node: ast.AST) -> ast.Call | ast.Name | ast.Attribute | None:
    """The rank side of ``rank > -1``, ``get_rank(g) < 0``, ``local_rank == -1`` (``_SET_TESTS``),
    else None."""
    if not (isinstance(node, ast.Compare) and len(node.ops) == 1):
        return None
    left, right = node.left, node.comparators[0]
    value = right if isinstance(right, (ast.Constant, ast.UnaryOp)) else None
    try:
        number = ast.literal_eval(value) if value is not None else None
    except (ValueError, TypeError, SyntaxError):
        return None
    if isinstance(number, bool) or not isinstance(number, int) \
            or (type(node.ops[0]), number) not in _SET_TESTS:
        return None
    return left if _rank_term(_terminal(left.func if isinstance(left, ast.Call) else left)) \
        else None


def _unset_or_world(node: ast.AST) -> bool:
    """``rank is None`` (``_none_test``), or a test of whether there is a rank at all that names
    no group (``get_rank() > -1``, ``local_rank == -1``): alike on every rank of a job. With a
    group (``get_rank(g) < 0``) it asks for membership (``membership_subjects``)."""
    if _none_test(node):
        return True
    side = _set_test(node)
    return side is not None and not (isinstance(side, ast.Call)
                                     and (side.args or side.keywords))


def _none_test(node: ast.AST) -> bool:
    """``rank is None``, ``src_rank is not None``, ``get_rank() is None``: whether a rank is set
    at all, which is alike on every rank of a job (all have one, or none). Only a rank by its own
    name: a value computed from the rank (``out = x if rank == 0 else None``) may be None on some
    ranks alone."""
    if not (isinstance(node, ast.Compare) and len(node.ops) == 1
            and isinstance(node.ops[0], (ast.Is, ast.IsNot))):
        return False
    sides = (node.left, node.comparators[0])
    if not any(isinstance(s, ast.Constant) and s.value is None for s in sides):
        return False
    other = next((s for s in sides if not (isinstance(s, ast.Constant) and s.value is None)),
                 None)
    if other is None:
        return False
    return _rank_term(_terminal(other.func if isinstance(other, ast.Call) else other))


def _rank_term(name: str | None) -> bool:
    """A name, attribute or called function that is this rank by its name (``rank_like``) or
    returns it (``RANK_CALLS``)."""
    return name is not None and (name in RANK_CALLS or rank_like(name))


def _uniform(node: ast.AST) -> bool:
    """A call of a collective whose result is the same on every rank (``UNIFORM_CALLS``)."""
    if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
            and node.func.attr in UNIFORM_CALLS):
        return False
    receiver = _dotted(node.func.value)
    return receiver is None or receiver.split(".")[0] not in _LOCAL_RECEIVERS


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
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
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
        inner = Deps(_Facts(None, lines, _global_lookup(path, held, depth - 1)))
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
