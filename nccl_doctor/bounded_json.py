"""JSON read with bounds: every JSON nccl-doctor reads from a file or a peer goes through here.

A file is read up to ``limit`` bytes (``MAX_BYTES`` unless the caller knows a smaller bound) and
parsed; a document nested deeper than ``MAX_DEPTH`` arrays and objects is refused (Python's own
parser gives up near a thousand levels with a RecursionError; it is refused here in the same
words). Each failure is a ``JsonDamaged`` (a ``ValueError``) whose message says what is wrong
- too large, too deep, invalid at line L column C, not UTF-8 - for the reader to turn into a
note naming the file, or into the CLI's one-line error.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from nccl_doctor.files import read_regular

MAX_BYTES = 256 << 20  # 256 MiB: report.json of a 1,024-rank job is a few MiB
MAX_DEPTH = 100  # nccl-doctor's own files nest under 12 levels; Flight Recorder's JSON under 10


class JsonDamaged(ValueError):
    """A JSON document that cannot be used; the message says why."""


def loads(data: bytes | str, *, limit: int = MAX_BYTES) -> Any:
    """Parse ``data`` within the bounds."""
    if len(data) > limit:
        raise JsonDamaged(f"larger than its limit ({_size(limit)})")
    if isinstance(data, bytes):
        try:
            data = data.decode("utf-8")
        except UnicodeDecodeError as err:
            raise JsonDamaged(f"not UTF-8 (byte {err.start})") from None
    try:
        value = json.loads(data)
    except RecursionError:
        raise JsonDamaged(f"nested deeper than {MAX_DEPTH} levels") from None
    except ValueError as err:
        line, col = getattr(err, "lineno", None), getattr(err, "colno", None)
        where = f" at line {line} column {col}" if line is not None else ""
        why = getattr(err, "msg", None) or str(err)
        raise JsonDamaged(f"invalid JSON{where} ({why})") from None
    if depth(value) > MAX_DEPTH:
        raise JsonDamaged(f"nested deeper than {MAX_DEPTH} levels")
    return value


def lines(raw: bytes) -> tuple[list[Any], str]:
    """The values of a JSON-lines file's ``raw`` bytes, and what was wrong with the rest in
    words ("" when every non-blank line parsed): how many lines were skipped, and the first."""
    values, bad = [], []
    for number, line in enumerate(raw.split(b"\n"), 1):
        if not line.strip():
            continue
        try:
            values.append(loads(line))
        except JsonDamaged as err:
            bad.append((number, err))
    if not bad:
        return values, ""
    number, err = bad[0]
    total = len(values) + len(bad)
    return values, (f"{len(bad)} of {total} lines skipped as damaged (the first, line "
                    f"{number}: {err})")


def load_file(path: Path, *, limit: int = MAX_BYTES) -> Any:
    """Read and parse the JSON file ``path`` within the bounds (``OSError`` if unreadable)."""
    return loads(read_regular(path, limit + 1), limit=limit)


def depth(value: Any) -> int:
    """How deeply arrays and objects nest in a parsed value (a scalar: 0), without recursion."""
    deepest = 0
    stack = [(value, 1)]
    while stack:
        item, level = stack.pop()
        if isinstance(item, dict):
            children = item.values()
        elif isinstance(item, list):
            children = item
        else:
            continue
        if level > deepest:
            deepest = level
            if deepest > MAX_DEPTH:
                return deepest
        stack.extend((child, level + 1) for child in children
                     if isinstance(child, (dict, list)))
    return deepest


def _size(n: int) -> str:
    return f"{n >> 20} MiB" if n >= 1 << 20 else f"{n} bytes"
