"""Text from the job, made safe to print on a terminal.

A rank's exception message, a callsite's path, a host name, a stack frame: all of it comes from
the job or from a capture file someone handed over, and may hold ESC, CSI or OSC sequences that
would recolour, retitle or rewrite the user's terminal (or forge the doctor's own lines). Every
control character is shown as its Python escape instead (``\\x1b``, ``\\x9b``), so the text stays
readable and the bytes are visible; JSON output needs none of this (its encoder escapes them).
"""

from __future__ import annotations

import re

__all__ = ["visible"]

# C0 controls, DEL and C1 controls (Unicode category Cc); tab is as harmless as a space
_CONTROL = re.compile("[\x00-\x08\x0a-\x1f\x7f-\x9f]")
_CONTROL_BUT_NEWLINE = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f]")


def _shown(m: re.Match[str]) -> str:
    return f"\\x{ord(m.group()):02x}"


def visible(text: str, *, newlines: bool = False) -> str:
    """``text`` with every control character but tab written out as ``\\xNN``; with
    ``newlines``, "\\n" is kept too (a multi-line detail the caller splits into lines)."""
    return (_CONTROL_BUT_NEWLINE if newlines else _CONTROL).sub(_shown, text)
