"""A place in source code: a recorded callsite, a frame of a stack sample, where a rank raised.

One type, one formatter (``Location.text``) for the ways the reports name a place.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any

from nccl_doctor import paths

__all__ = ["Location"]


@dataclass(frozen=True)
class Location:
    path: str
    line: int
    function: str = ""
    # what the recorder saw of a call path's frame (rank/recorder/arguments.py), not part of
    # which place it is: it only passes its call on (a decorator's wrapper, a comm shim), and
    # it was called by torch (a module hook, a torch decorator) rather than by the next frame
    passes_on: bool = field(default=False, compare=False)
    from_torch: bool = field(default=False, compare=False)

    def __str__(self) -> str:
        return f"{self.path}:{self.line}"

    @property
    def where(self) -> str:
        """``path:line`` as recorded."""
        return str(self)

    def text(self, style: str = "short") -> str:
        """``short``: path:line, the path relative to the working directory when below it;
        ``in``: the same and `` in function``; ``frame``: ``path:line function`` (a stack
        class's frame); ``base``: the file's name only, then line and function."""
        if style == "base":
            return f"{os.path.basename(self.path) or self.path}:{self.line} {self.function}"
        short = f"{paths.short_path(self.path)}:{self.line}"
        if style == "in":
            return f"{short} in {self.function}"
        if style == "frame":
            return f"{short} {self.function}"
        return short

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"path": self.path, "line": self.line, "function": self.function}
        if self.passes_on:
            out["passes_on"] = True
        if self.from_torch:
            out["from_torch"] = True
        return out
