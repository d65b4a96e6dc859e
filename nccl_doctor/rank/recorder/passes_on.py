"""Whether a library frame only passes its call on: it is never "the line that issued" a call.

Decorators' wrappers (``typing_extensions.deprecated``, ``functools.wraps``-style ``wrapper(*args,
**kwargs)``), logging shims (torch's ``c10d_logger``), guards (Accelerate's
``verify_operation``) and comm layers (DeepSpeed's ``comm.all_gather_into_tensor(output_tensor=
output_tensor, ...)``) make the call they are in with nothing of their own: every argument is
one of the frame's own parameters, unchanged, or a constant. That is what is checked, on the
call the frame is making (the instruction at ``f_lasti``, located in the source by its
position), not on a list of files: a frame that builds an argument (a tensor, a buffer, a
sliced list) decided something, and may be the issuing line.

Asked once per (code object, instruction) by the recorder's describer, only when a call path is
seen for the first time, so nothing here is on the hot path. Never raises: anything it cannot
read says "no" (the frame may then be named as the issuing line, as before this check).
"""

from __future__ import annotations

import ast
import dis
import inspect
import sys
from types import CodeType

_MAX_BYTES = 4_000_000  # a source file larger than this is not read
_KEEP_FILES = 8  # the files whose lines are kept between look-ups (a path walks a few files)

_lines: dict[str, list[bytes]] = {}
_params: dict[int, tuple[CodeType, frozenset[str]]] = {}


def passes_on(code: CodeType, lasti: int) -> bool:
    """True when the call ``code`` is making at ``lasti`` passes only the frame's own
    parameters (never reassigned in it) and constants: ``f(*args, **kwargs)``,
    ``g(x, group=group, async_op=True)``, ``barrier()``."""
    try:
        call = _call_at(code, lasti)
        if call is None:
            return False
        own = _own_parameters(code)
        args = [a.value if isinstance(a, ast.Starred) else a for a in call.args]
        args += [k.value for k in call.keywords]
        return all(isinstance(a, ast.Constant) or (isinstance(a, ast.Name) and a.id in own)
                   for a in args)
    except Exception:  # noqa: BLE001 - the recorder never raises into the job
        return False


def _call_at(code: CodeType, lasti: int) -> ast.Call | None:
    """The call expression at instruction offset ``lasti``, parsed from the source."""
    if sys.version_info < (3, 11) or lasti < 0:
        return None
    positions = list(code.co_positions())
    index = lasti // 2
    if index >= len(positions):
        return None
    line, end_line, col, end_col = positions[index]
    if None in (line, end_line, col, end_col) or end_line < line or end_line - line > 50:
        return None
    lines = _source(code.co_filename)
    if lines is None or end_line > len(lines):
        return None
    if line == end_line:
        segment = lines[line - 1][col:end_col]
    else:
        segment = (lines[line - 1][col:] + b"".join(lines[line:end_line - 1])
                   + lines[end_line - 1][:end_col])
    try:
        tree = ast.parse(b"(" + segment + b"\n)", mode="eval")
    except (SyntaxError, ValueError):
        return None
    return tree.body if isinstance(tree.body, ast.Call) else None


def read_source(path: str, limit: int = _MAX_BYTES) -> bytes | None:
    """A source file's bytes (None: not a file - ``<frozen ...>``, ``<string>`` -, unreadable,
    or over ``limit`` bytes)."""
    if path.startswith("<"):
        return None
    try:
        with open(path, "rb") as f:
            data = f.read(limit + 1)
    except OSError:
        return None
    return data if len(data) <= limit else None


def _source(path: str) -> list[bytes] | None:
    lines = _lines.get(path)
    if lines is not None:
        return lines
    data = read_source(path)
    if data is None:
        return None
    if len(_lines) >= _KEEP_FILES:
        _lines.clear()
    lines = _lines[path] = data.splitlines(keepends=True)
    return lines


def _own_parameters(code: CodeType) -> frozenset[str]:
    """The frame's parameters that its body never assigns to (passing one on passes what the
    caller gave), and its ``*args`` and ``**kwargs`` even when it rebuilds them: a wrapper
    taking anything and passing it on knows nothing of the call (DeepSpeed's ``stage_on_cpu``
    copies each argument to the CPU and passes them all on)."""
    found = _params.get(id(code))
    if found is not None and found[0] is code:
        return found[1]
    n = code.co_argcount + code.co_kwonlyargcount
    names = set(code.co_varnames[:n])
    for ins in dis.get_instructions(code):
        if ins.opname.startswith(("STORE_FAST", "DELETE_FAST", "STORE_DEREF", "DELETE_DEREF")):
            value = ins.argval
            names.difference_update(value if isinstance(value, tuple) else (value,))
    star = code.co_varnames[n:n + bool(code.co_flags & inspect.CO_VARARGS)
                            + bool(code.co_flags & inspect.CO_VARKEYWORDS)]
    if len(_params) >= 4096:
        _params.clear()
    own = frozenset(names | set(star))
    _params[id(code)] = (code, own)
    return own
