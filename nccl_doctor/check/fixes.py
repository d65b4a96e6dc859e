"""The fix as a patch (``check --diff``, ``check --fix``): the findings whose fix is mechanical,
made with libcst so that the user's formatting and comments survive; the others described.

Two fixes are made, each only where it cannot change what the program computes:

- **made on every rank** (ND001, a collective; ND004, a catalog call, which the library means
  to be called on every rank): the call's statement is moved out of the arm of the rank
  condition it stands in - before the ``if`` when it is the arm's first statement, after it
  when it is the last. Only when the condition reads nothing but the rank (``if rank == 0``,
  not ``if rank == 0 and step % 100 == 0``: moved out, it would run on every step); the
  statement is the call alone (or one name assigned its result); nothing it reads is assigned
  in the ``if``; moved before, the condition does not read what it passes; moved after,
  nothing in the ``if`` jumps out (``return``, ``raise``, ``continue``, ``break``); the other
  arm makes no collective of its own (which one every rank should make is not guessed). An arm
  left empty is dropped (the ``if`` with it when its condition has no call with effects), else
  ``pass`` keeps it; the comments of what is dropped stay above the moved line.
- **synced_gpus=True** (ND005): the keyword added to the ``generate`` call as its arguments are
  laid out, or its ``False`` made ``True``; not where the call spreads ``**kwargs`` (they may
  hold it already), nor where it passes a flag (the author's to turn on).

A call of a function of the user's (ND002) is never moved: the function may do on one rank
what only one should (write the file), and only its author knows. Nor an early exit or a loop's
count (ND003), nor groups created in another order (ND006): where the collective should go is
the author's call. Each is described, with why and the rule's fix."""

from __future__ import annotations

import difflib
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

from nccl_doctor.check.engine import decoded
from nccl_doctor.check.rules import CheckFinding
from nccl_doctor.files import write_atomic

#: calls a rank condition may make that have no effect, so an ``if`` left empty is dropped
_PURE = frozenset({"get_rank", "get_world_size", "get_local_rank", "get_node_local_rank",
                   "is_initialized", "is_main_process", "is_local_main_process",
                   "is_world_process_zero", "is_local_process_zero", "int", "str", "getenv",
                   "get", "bool"})


@dataclass(frozen=True)
class Outcome:
    """What ``--fix`` did with one finding: ``done`` says the fix (``made`` true), or why it was
    not made (``made`` false; the finding's fix then stands as the description)."""

    finding: CheckFinding
    made: bool
    done: str


@dataclass(frozen=True)
class FileFix:
    path: str
    before: str
    after: str
    outcomes: tuple[Outcome, ...]
    encoding: str = "utf-8"

    def write(self) -> None:
        """The fixed text over the file, whole or not at all, its encoding and mode kept."""
        target = Path(self.path)
        write_atomic(target, self.after, encoding=self.encoding,
                     mode=stat.S_IMODE(target.stat().st_mode))

    def diff(self, shown_as: str) -> str:
        return "".join(difflib.unified_diff(
            self.before.splitlines(keepends=True), self.after.splitlines(keepends=True),
            fromfile=f"a/{shown_as.lstrip('/')}", tofile=f"b/{shown_as.lstrip('/')}"))


def fix_files(findings: Sequence[CheckFinding]) -> list[FileFix]:
    """Each file with findings, read as it is now, with its fixes made (in memory)."""
    by_path: dict[str, list[CheckFinding]] = {}
    for f in findings:
        by_path.setdefault(f.path, []).append(f)
    out = []
    for path, found in by_path.items():
        try:
            text, encoding = decoded(Path(path).read_bytes())  # (\r\n stays)
        except (OSError, SyntaxError, LookupError, UnicodeDecodeError) as err:
            why = f"not fixed: the file cannot be read again ({type(err).__name__})"
            out.append(FileFix(path, "", "", tuple(Outcome(f, False, why) for f in found)))
            continue
        out.append(fix_text(path, text, found, encoding))
    return out


def fix_text(path: str, text: str, findings: Sequence[CheckFinding],
             encoding: str = "utf-8") -> FileFix:
    """``text`` (the file at ``path``) with the mechanical fixes of ``findings`` (its own) made."""
    import libcst as cst
    from libcst.metadata import MetadataWrapper, ParentNodeProvider, PositionProvider

    try:
        wrapper = MetadataWrapper(cst.parse_module(text))
    except (cst.ParserSyntaxError, RecursionError) as err:
        why = f"not fixed: libcst cannot parse the file ({type(err).__name__})"
        return FileFix(path, text, text, tuple(Outcome(f, False, why) for f in findings),
                       encoding)
    positions = wrapper.resolve(PositionProvider)
    parents = wrapper.resolve(ParentNodeProvider)
    plan = _Plan(cst, positions, parents, findings)
    outcomes = []
    for f in findings:
        outcomes.append(plan.add(f))
    if not plan.moves and not plan.synced:
        return FileFix(path, text, text, tuple(outcomes), encoding)
    after = wrapper.module.visit(_transformer(plan)).code
    return FileFix(path, text, after, tuple(outcomes), encoding)


class _Plan:
    """The fixes decided on the original tree (nodes by identity): moves (an ``if`` -> its arms'
    statements to move, before or after) and ``generate`` calls to sync."""

    def __init__(self, cst, positions, parents, findings: Sequence[CheckFinding]) -> None:
        self.cst, self.positions, self.parents = cst, positions, parents
        self.findings = findings
        self.moves: dict[object, dict[tuple[str, int], str]] = {}  # If -> (arm, index) -> where
        self.synced: set[object] = set()
        self._by_line: dict[int, list] | None = None

    def _line(self, node) -> int:
        return self.positions[node].start.line

    def _nodes(self, kind, line: int) -> list:
        if self._by_line is None:
            self._by_line = {}
            for n, p in self.positions.items():
                if isinstance(n, (self.cst.If, self.cst.Call)):
                    self._by_line.setdefault(p.start.line, []).append(n)
        return [n for n in self._by_line.get(line, ()) if isinstance(n, kind)]

    def add(self, f: CheckFinding) -> Outcome:
        if f.code == "ND005":
            return self._sync(f)
        if f.code not in ("ND001", "ND004"):
            return Outcome(f, False, "not fixed: " + {
                "ND002": "a function of yours may do on one rank what only one should (write a "
                         "file): only you can say whether every rank may call it",
                "ND003": "where the collective should go around the exit is yours to say",
            }.get(f.code, "no mechanical fix") + f". {f.fix or f.rule.fix}")
        why = self._move(f)
        return Outcome(f, why is None, why or "")

    # -- synced_gpus=True --------------------------------------------------------------------
    def _sync(self, f: CheckFinding) -> Outcome:
        cst = self.cst
        calls = [c for c in self._nodes(cst.Call, f.line) if _code(cst, c.func) == f.call]
        if len(calls) != 1:
            return Outcome(f, False, "not fixed: the generate call was not found as written")
        call = calls[0]
        given = next((a.value for a in call.args if a.keyword is not None
                      and a.keyword.value == "synced_gpus"), None)
        if given is not None and not (isinstance(given, cst.Name) and given.value == "False"):
            return Outcome(f, False, f"not fixed: synced_gpus is `{_code(cst, given)}`, yours "
                                     "to decide: make it True on a sharded model (give the "
                                     "flag, or make it the default)")
        if any(a.star == "**" for a in call.args):
            return Outcome(f, False, "not fixed: the call spreads **kwargs, which may hold "
                                     "synced_gpus already; pass synced_gpus=True in them")
        self.synced.add(call)
        return Outcome(f, True, "synced_gpus=True passed to generate")

    # -- made on every rank ------------------------------------------------------------------
    def _move(self, f: CheckFinding) -> str | None:
        """None when the move is planned, else why not."""
        cst = self.cst
        ifs = [n for n in self._nodes(cst.If, f.condition_line)
               if not isinstance(self.parents.get(n), cst.If)]  # (an elif's node is an If's orelse)
        if len(ifs) != 1:
            return ("not fixed: the condition is not a plain `if` (an elif, a while, a "
                    "conditional expression): the collective cannot be moved out of it alone")
        node = ifs[0]
        if self._nested(node):
            return "not fixed in this pass: fix the other finding around it first, then again"
        arms = {"body": list(node.body.body)}
        if isinstance(node.orelse, cst.Else):
            arms["else"] = list(node.orelse.body.body)
        found = [(arm, i) for arm, stmts in arms.items() for i, s in enumerate(stmts)
                 if self._line(s) == f.line]
        if not found:
            return ("not fixed: the call is not a statement of its own directly under the "
                    "condition")
        arm, i = found[0]
        stmt = arms[arm][i]
        other = [g for g in self.findings if g.condition_line == f.condition_line
                 and any(self._line(s) <= g.line <= self.positions[s].end.line
                         for a, stmts in arms.items() if a != arm for s in stmts)]
        if other:
            return (f"not fixed: the other arm makes `{other[0].call}` (line {other[0].line}): "
                    "which collectives every rank should make is yours to say")
        call = _the_call(cst, stmt, f.call)
        if call is None:
            return ("not fixed: the call is part of a larger statement; make it a statement "
                    "of its own, or move it out by hand")
        extra = _terms(cst, node.test) - {n.replace(" ", "") for n in f.names}
        if extra:
            return (f"not fixed: the condition also reads {', '.join(sorted(extra))}, which "
                    "need not differ by rank: moved out, the call would run where it did not "
                    "before. Make it on every rank under that part of the condition alone")
        reads = _names(cst, call)
        assigned = _assigned(cst, node)
        if reads & assigned:
            return (f"not fixed: it reads {', '.join(sorted(reads & assigned))}, assigned "
                    "under the condition: the other ranks have no value to pass")
        stmts = arms[arm]
        first, last = i == 0, i == len(stmts) - 1
        passed = (_names(cst, stmt) - _names(cst, call)) | {
            n for a in call.args for n in _names(cst, a)}  # (its arguments, and its target)
        before = first and not passed & _names(cst, node.test)
        after = last and not _jumps(cst, node)
        where = "before" if before else "after" if after else None
        if where is None:
            return ("not fixed: moved out, the call would run before or after code it did not "
                    "(it is neither the first nor the last statement of its arm, or the "
                    "condition reads what it passes, or the `if` jumps out)")
        self.moves.setdefault(node, {})[(arm, i)] = where
        return None

    def _nested(self, node) -> bool:
        """``node`` is inside an ``if`` already planned, or holds one."""
        def above(n) -> set:
            out, p = set(), self.parents.get(n)
            while p is not None:
                out.add(p)
                p = self.parents.get(p)
            return out

        return bool(above(node) & set(self.moves)) or any(node in above(m) for m in self.moves)


def _transformer(plan: _Plan):
    """The libcst transformer that makes ``plan`` (its class built here: libcst is imported
    only by ``--diff`` and ``--fix``)."""
    import libcst as cst

    class Apply(cst.CSTTransformer):
        def __init__(self, plan: _Plan) -> None:
            super().__init__()
            self.plan = plan

        def leave_Call(self, original, updated):
            if original not in self.plan.synced:
                return updated
            args = list(updated.args)
            for k, a in enumerate(args):
                if a.keyword is not None and a.keyword.value == "synced_gpus":
                    args[k] = a.with_changes(value=cst.Name("True"))
                    return updated.with_changes(args=args)
            new = cst.Arg(keyword=cst.Name("synced_gpus"), value=cst.Name("True"),
                          equal=cst.AssignEqual(whitespace_before=cst.SimpleWhitespace(""),
                                                whitespace_after=cst.SimpleWhitespace("")))
            if args:
                args[-1], new = _after_last(cst, updated, args, new)
            return updated.with_changes(args=[*args, new])

        def leave_If(self, original, updated):
            moves = self.plan.moves.get(original)
            if not moves:
                return updated
            before, after = [], []
            body = list(updated.body.body)
            orelse = updated.orelse
            kept = {"body": body, "else": list(orelse.body.body)
                    if isinstance(orelse, cst.Else) else []}
            for (arm, i), where in sorted(moves.items()):
                (before if where == "before" else after).append(kept[arm][i])
            for arm in kept:
                gone = {i for (a, i) in moves if a == arm}
                kept[arm] = [s for i, s in enumerate(kept[arm]) if i not in gone]
            said = []  # the comments of what is dropped (an ``else:``'s, an ``if``'s line)
            if isinstance(orelse, cst.Else):
                if kept["else"]:
                    orelse = orelse.with_changes(body=orelse.body.with_changes(body=kept["else"]))
                else:
                    said += [*orelse.leading_lines, *_header(cst, orelse.body)]
                    orelse = None
            if not kept["body"] and orelse is None and _pure(cst, updated.test):
                moved = [*before, *after]
                if not moved:
                    return cst.RemovalSentinel.REMOVE
                said = [*updated.leading_lines, *_header(cst, updated.body), *said]
                moved[0] = moved[0].with_changes(leading_lines=[*said, *moved[0].leading_lines])
                return cst.FlattenSentinel(moved)
            if said and after:
                after[0] = after[0].with_changes(leading_lines=[*said, *after[0].leading_lines])
            elif said and before:
                before[0] = before[0].with_changes(leading_lines=[*said, *before[0].leading_lines])
            if not kept["body"]:
                kept["body"] = [cst.SimpleStatementLine([cst.Pass()])]
            new_if = updated.with_changes(
                body=updated.body.with_changes(body=kept["body"]), orelse=orelse)
            if before and new_if.leading_lines:
                # the comments above the ``if`` stay above it; the moved call goes above them
                first = before[0]
                before[0] = first.with_changes(leading_lines=[*new_if.leading_lines,
                                                              *first.leading_lines])
                new_if = new_if.with_changes(leading_lines=())
            return cst.FlattenSentinel([*before, new_if, *after])

    return Apply(plan)


def _after_last(cst, call, args: list, new):
    """The call's last argument and ``new`` placed after it as the call's arguments are laid
    out: one a line (``new`` on a line of its own, at their indent, a trailing comma and the
    last one's comment kept) or on a line (``, synced_gpus=True`` after the last)."""
    last = args[-1]
    sep = (args[-2].comma.whitespace_after if len(args) > 1 and isinstance(args[-2].comma,
                                                                           cst.Comma)
           else call.whitespace_before_args)
    lines = isinstance(sep, cst.ParenthesizedWhitespace)
    if isinstance(last.comma, cst.Comma):  # a trailing comma: the new one gets one too
        tail = last.comma.whitespace_after
        if lines and isinstance(tail, cst.ParenthesizedWhitespace):
            last = last.with_changes(comma=last.comma.with_changes(
                whitespace_after=sep.with_changes(first_line=tail.first_line)))
            new = new.with_changes(comma=cst.Comma(whitespace_after=tail.with_changes(
                first_line=cst.TrailingWhitespace(), empty_lines=())))
        else:
            last = last.with_changes(comma=last.comma.with_changes(
                whitespace_after=cst.SimpleWhitespace(" ")))
            new = new.with_changes(comma=cst.Comma(whitespace_after=tail))
        return last, new
    tail = last.whitespace_after_arg
    last = last.with_changes(comma=cst.Comma(whitespace_after=sep if lines else
                                             cst.SimpleWhitespace(" ")),
                             whitespace_after_arg=cst.SimpleWhitespace(""))
    return last, new.with_changes(whitespace_after_arg=tail)


def _header(cst, block) -> list:
    """The comment on a block's header line (``if rank == 0:  # why``) as a line of its own."""
    comment = block.header.comment
    return [cst.EmptyLine(comment=comment)] if comment is not None else []


def _code(cst, node) -> str:
    return cst.Module(body=()).code_for_node(node)


def _the_call(cst, stmt, name: str):
    """The call ``name`` when ``stmt`` is that call alone, or one name assigned its result."""
    if not isinstance(stmt, cst.SimpleStatementLine) or len(stmt.body) != 1:
        return None
    small = stmt.body[0]
    value = small.value if isinstance(small, cst.Expr) else (
        small.value if isinstance(small, cst.Assign) and len(small.targets) == 1
        and isinstance(small.targets[0].target, cst.Name) else None)
    if isinstance(value, cst.Await):
        value = value.expression
    if isinstance(value, cst.Call) and _code(cst, value.func) == name:
        return value
    return None


def _names(cst, node) -> set[str]:
    out: set[str] = set()

    class V(cst.CSTVisitor):
        def visit_Name(self, n) -> None:
            out.add(n.value)

        def visit_Attribute(self, n) -> bool:
            n.value.visit(self)
            return False  # (the attribute's own name is not a variable)

    node.visit(V())
    return out - {"True", "False", "None"}


def _assigned(cst, node) -> set[str]:
    """The names bound anywhere in ``node`` (assignments, loop and with targets, imports,
    walrus, definitions)."""
    out: set[str] = set()

    def targets(t) -> None:
        if isinstance(t, cst.Name):
            out.add(t.value)
        elif isinstance(t, (cst.Tuple, cst.List)):
            for e in t.elements:
                targets(e.value)
        elif isinstance(t, cst.StarredElement):
            targets(t.value)

    class V(cst.CSTVisitor):
        def visit_AssignTarget(self, n) -> None:
            targets(n.target)

        def visit_AugAssign(self, n) -> None:
            targets(n.target)

        def visit_AnnAssign(self, n) -> None:
            targets(n.target)

        def visit_For(self, n) -> None:
            targets(n.target)

        def visit_AsName(self, n) -> None:
            targets(n.name)

        def visit_NamedExpr(self, n) -> None:
            targets(n.target)

        def visit_ImportAlias(self, n) -> None:
            if n.asname is None:
                out.add(_code(cst, n.name).split(".")[0])

        def visit_FunctionDef(self, n) -> None:
            out.add(n.name.value)

        def visit_ClassDef(self, n) -> None:
            out.add(n.name.value)

    node.visit(V())
    return out


def _jumps(cst, node) -> bool:
    """Something in ``node`` leaves it: a ``return``, ``raise``, ``continue`` or ``break``."""
    found = []

    class V(cst.CSTVisitor):
        def on_visit(self, n) -> bool:
            if isinstance(n, (cst.Return, cst.Raise, cst.Continue, cst.Break)):
                found.append(n)
            return True

    node.visit(V())
    return bool(found)


def _terms(cst, test) -> set[str]:
    """The names, attribute chains and calls of them without arguments a condition reads, as
    written without spaces (``rank``, ``dist.get_rank()``, ``accelerator.is_main_process``)."""
    out: set[str] = set()

    class V(cst.CSTVisitor):
        def visit_Call(self, n) -> bool:
            if not n.args and isinstance(n.func, (cst.Name, cst.Attribute)):
                out.add(_code(cst, n).replace(" ", ""))
                return False
            return True

        def visit_Attribute(self, n) -> bool:
            out.add(_code(cst, n).replace(" ", ""))
            return False

        def visit_Name(self, n) -> None:
            if n.value not in ("True", "False", "None"):
                out.add(n.value)

    test.visit(V())
    return out


def _pure(cst, test) -> bool:
    """The condition makes no call but of ``_PURE`` names."""
    calls = []

    class V(cst.CSTVisitor):
        def visit_Call(self, n) -> None:
            calls.append(_code(cst, n.func).rpartition(".")[2])

    test.visit(V())
    return all(c in _PURE for c in calls)
