"""Which arm of a test on the rank is the special case, and which the ranks' default path.

``if rank == 0: dist.barrier()`` singles rank 0 out: the ranks in its body took the special
path, and made a call the others never make. ``if rank != skipper: dist.broadcast(t)`` singles
the skipper out by leaving it out: the body is every other rank's default path, and the rank
that did *not* enter it is the odd one. The analysis (analysis/who/blame.py) blames the side that
took the special path, so it needs to know which arm that is: read from the test itself -

- an equality (``==``, ``is``, ``in``) singles the ranks that pass it out; an inequality
  (``!=``, ``is not``, ``not in``) and an ordering (``rank > 0``: every rank but the first)
  single out the ranks that fail it;
- a rank flag (``is_main_process``, ``is_global_zero``, ``is_master``) is true on the special
  ranks; a rank *number* tested for truth (``if rank:``) is true on every rank but rank 0;
- ``not`` turns it round; of ``and``/``or``, the first operand on the rank decides.

Pure: the branch's source line in, True (the body is special), False (the body is the default
path) or None (nothing on the rank read in it) out.
"""

from __future__ import annotations

import ast
import re
from typing import Sequence

__all__ = ["body_is_special"]

_FLAG_WORDS = re.compile(r"(?:^|_)(?:is|main|master|zero|first|last|leader|chief|head)(?:_|$)",
                         re.I)


def body_is_special(text: str, names: Sequence[str]) -> bool | None:
    """Whether the ranks that enter the body of the branch whose header is ``text`` (an
    ``if``/``elif``/``while`` line; ``names``: the rank-dependent names its test uses) are the
    ones it singles out. None when the test cannot be read or holds none of ``names``."""
    header = text.strip()
    if header.startswith("elif"):
        header = header[2:]  # (an elif's test reads as an if's)
    try:  # the header as a statement of its own: comments and all, as Python reads it
        stmt = ast.parse(header + "\n    pass\n").body[0]
    except SyntaxError:
        return None
    if not isinstance(stmt, (ast.If, ast.While)):
        return None
    return _special(stmt.test, tuple(names))


def _on_rank(node: ast.AST, names: tuple[str, ...]) -> bool:
    try:
        text = ast.unparse(node)
    except Exception:  # noqa: BLE001 - an odd tree reads as "not on the rank"
        return False
    return any(n and n in text for n in names)


def _special(node: ast.AST, names: tuple[str, ...]) -> bool | None:
    if not _on_rank(node, names):
        return None
    if isinstance(node, ast.BoolOp):
        for value in node.values:
            got = _special(value, names)
            if got is not None:
                return got
        return None
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.Not):
        got = _special(node.operand, names)
        return None if got is None else not got
    if isinstance(node, ast.Compare):
        op = node.ops[0]
        if isinstance(op, (ast.Eq, ast.Is, ast.In)):
            return True
        return False  # !=, is not, not in, <, >, <=, >=: every rank but some
    if isinstance(node, (ast.Name, ast.Attribute, ast.Call)):
        return _flag(node)
    return True


def _flag(node: ast.AST) -> bool:
    """A rank flag (true on the ranks it names) rather than a rank number (true on every rank
    but rank 0)."""
    target = node.func if isinstance(node, ast.Call) else node
    name = target.attr if isinstance(target, ast.Attribute) else getattr(target, "id", "")
    return bool(_FLAG_WORDS.search(name)) or "main" in name.lower()
