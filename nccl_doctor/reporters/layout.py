"""Plain text laid out to a width, for the console: where each line of a paragraph ends, and how
many columns of a table fit on a row. Pure: text and widths in, offsets and counts out.

A line ends between words, never inside one: a ``path:line``, a shape, a rank's state stays
whole (a word longer than the whole width stands alone on its line, over the width, rather than
cut). A headline ends between its phrases when it can (after ``:``, ``;`` or a clause's ``,``,
before ``(``, ``-``, an arrow or a preposition). With no width (a pipe, a file) every line is one
line.
"""

from __future__ import annotations

import os
import re
from typing import Sequence, TextIO

from rich.cells import cell_len

__all__ = ["MIN_WIDTH", "fitting_columns", "spans", "width_of"]

#: the narrowest width laid out for (a narrower terminal gets lines this wide)
MIN_WIDTH = 40
_WORD = re.compile(r"\S+")
_ARROWS = ("-", "<-", "->", "--")
#: words a phrase starts with (a line may end before them): prepositions and conjunctions
_PHRASE_WORDS = frozenset({"at", "after", "before", "while", "when", "which", "that", "in", "on",
                           "for", "from", "with", "then", "but", "and", "or", "so", "because"})


def width_of(stream: TextIO) -> int | None:
    """The columns to lay out for: ``COLUMNS`` when set (as rich and the shells read it), else
    the width of the terminal ``stream`` is; None for a pipe or a file (no line is wrapped)."""
    columns = os.environ.get("COLUMNS", "").strip()
    if columns.isdigit() and int(columns) > 0:
        return max(int(columns), MIN_WIDTH)
    try:
        if stream.isatty():
            return max(os.get_terminal_size(stream.fileno()).columns, MIN_WIDTH)
    except (AttributeError, ValueError, OSError):
        pass
    return None


def spans(text: str, first: int | None, rest: int | None = None, *,
          phrases: bool = False) -> list[tuple[int, int]]:
    """The (start, end) offsets in ``text`` of each line it wraps to: ``first`` columns for the
    first line, ``rest`` for the others (default ``first``), None: one line. With ``phrases`` a
    line ends at a phrase's end when one lies in its second half (else in its last three
    quarters, else between words)."""
    words = list(_WORD.finditer(text))
    if not words:
        return [(0, 0)]
    if first is None:
        return [(0, words[-1].end())]
    rest = first if rest is None else rest
    lines: list[tuple[int, int]] = []
    i = 0
    while i < len(words):
        room = first if not lines else rest
        start = words[i].start() if lines else 0  # (a paragraph's own indent is kept)
        j = i + 1
        while j < len(words) and cell_len(text[start:words[j].end()]) <= room:
            j += 1
        if j < len(words):
            end = _phrase_end(text, words, start, i, j, room) if phrases else None
            # else between words, not inside "ranks 0, 2" when the line can end before it
            j = end or next((k for k in range(j, i, -1) if not _glued(words, k)), j)
        lines.append((start, words[j - 1].end()))
        i = j
    return lines


def _phrase_end(text: str, words: Sequence[re.Match[str]], start: int, i: int, j: int,
                room: int) -> int | None:
    """Where a headline's line (from ``start``) that could hold words i..j-1 ends best: before
    the word of the strongest phrase boundary that leaves it at least half full (else a
    quarter); None: no boundary does."""
    for share in (2, 4):
        best = max(((_boundary(text, words, k), k) for k in range(i + 1, j + 1)
                    if cell_len(text[start:words[k - 1].end()]) * share >= room),
                   default=(0, j))
        if best[0] > 0:
            return best[1]
    return None


_BEFORE_NUMBER = ("rank", "ranks", "group", "#")


def _glued(words: Sequence[re.Match[str]], k: int) -> bool:
    """Words k-1 and k read as one: a list of numbers ("0, 2"), "rank 3", "group 0"."""
    before, word = words[k - 1].group(), words[k].group()
    return word[:1].isdigit() and (before.rstrip(",").isdigit() and before.endswith(",")
                                   or before.lower() in _BEFORE_NUMBER)


def _boundary(text: str, words: Sequence[re.Match[str]], k: int) -> int:
    """How strong a phrase boundary lies before word k: 3 a clause (``;``, ``(``, ``[``, a dash
    or an arrow), 2 after a ``:``, 1 after a ``,`` that is not inside a list of numbers or before a
    preposition or conjunction ("at", "while"), 0 none; one inside parentheses is weaker (a
    parenthesis is kept whole when it can be)."""
    before, word = words[k - 1].group(), words[k].group()
    if before.endswith(";") or word.startswith(("(", "[")) or word in _ARROWS:
        level = 3
    elif before.endswith(":"):
        level = 2
    elif before.endswith(",") and not _glued(words, k) or word in _PHRASE_WORDS:
        level = 1
    else:
        return 0
    head = text[:words[k].start()]
    inside = head.count("(") + head.count("[") > head.count(")") + head.count("]")
    return max(level - 2, 1) if inside else level


def fitting_columns(widths: Sequence[int], width: int | None, gap: int = 2) -> int:
    """How many of a table's leading columns (each ``widths[i]`` wide, ``gap`` between them) fit
    in ``width`` (all of them for None; the first always)."""
    if width is None:
        return len(widths)
    used, shown = -gap, 0
    for w in widths:
        used += gap + w
        if used > width and shown:
            break
        shown += 1
    return shown
