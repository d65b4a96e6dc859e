"""Cheap, cached descriptions of call arguments and callsites for the recorder's hot path."""

from __future__ import annotations

import sys
from types import CodeType, FrameType
from typing import Any, Callable

from nccl_doctor import paths
_UNIFORM_CHECK_LIMIT = 16  # lists longer than this are described by their first member


class Describer:
    """Interns tensor descriptions and callsites through ``intern`` (the capture's string table)."""

    def __init__(self, intern: Callable[[str], int]) -> None:
        self._intern = intern
        # (dtype, shape), (n, dtype, shape) or a constant -> (string id, bytes). The recorder's
        # hot path reads it directly before calling ``tensor``.
        self.tensors: dict[Any, tuple[int, int]] = {}
        # (id(code), f_lasti) of a caller in the user's own code -> its ``callsites`` answer: the
        # hot path's first look-up, which saves walking the stack when torch is called directly.
        self.direct: dict[tuple[int, int], tuple[int, int, int, int, int]] = {}
        # Keyed by id(code): hashing a code object hashes its whole body on every call. The value
        # holds the code object, so it stays alive and its id cannot be reused.
        self._code: dict[int, tuple[bool, bool, int, int, CodeType]] = {}
        self._lines: dict[tuple[int, int], int] = {}

    # -- tensors -----------------------------------------------------------------------------
    def tensor(self, t: Any) -> tuple[int, int]:
        """(string id of the description, bytes) for a tensor, a list of tensors, or an object."""
        shape = getattr(t, "shape", None)
        if shape is not None:
            key = (t.dtype, shape)
            found = self.tensors.get(key)
            if found is None:  # (id, bytes): bytes follow from dtype and shape
                found = self.tensors[key] = (self._intern(_sig(t.dtype, shape)), t.nbytes)
            return found
        if isinstance(t, (list, tuple)):
            return self._tensor_list(t)
        return self._intern_const("object"), 0

    def _tensor_list(self, items: list | tuple) -> tuple[int, int]:
        n = len(items)
        if n == 0:
            return self._intern_const("[]"), 0
        first = items[0]
        shape = getattr(first, "shape", None)
        if shape is None:
            if isinstance(first, (list, tuple)):
                return self._intern_const(f"{n}*list"), 0
            return self._intern_const(f"{n}*object"), 0
        if n <= _UNIFORM_CHECK_LIMIT:
            dtype = first.dtype
            for other in items:
                if other.shape != shape or other.dtype != dtype:
                    desc = ";".join(_sig(x.dtype, x.shape) for x in items)
                    return self._intern(desc), sum(x.nbytes for x in items)
        key = (n, first.dtype, shape)
        found = self.tensors.get(key)
        if found is None:
            found = self.tensors[key] = (
                self._intern(f"{n}*{_sig(first.dtype, shape)}"), first.nbytes * n
            )
        return found

    def _intern_const(self, text: str) -> int:
        found = self.tensors.get(text)
        if found is None:
            found = self.tensors[text] = (self._intern(text), 0)
        return found[0]

    # -- callsites ---------------------------------------------------------------------------
    def callsites(self, frame: FrameType | None) -> tuple[int, int, int, int, int]:
        """(user file, line, function, api file, api line) string ids / numbers.

        The user callsite is the first frame outside torch and its wrapping libraries; the API
        callsite is the first frame outside torch (it may be in accelerate or trl). Line numbers
        are cached by (code, instruction offset): ``f_lineno`` decodes the line table each time.
        """
        api_file = api_line = 0
        cache, lines = self._code, self._lines
        first = frame
        while frame is not None:
            code = frame.f_code
            cid = id(code)
            info = cache.get(cid)
            if info is None:
                info = cache[cid] = self._code_info(code)
            if not info[1]:
                key = (cid, frame.f_lasti)
                line = lines.get(key)
                if line is None:
                    line = lines[key] = frame.f_lineno or 0
                if not api_file:
                    api_file, api_line = info[2], line
                if not info[0]:
                    site = info[2], line, info[3], api_file, api_line
                    if frame is first:  # depends on this frame alone: remember it
                        self.direct[(cid, frame.f_lasti)] = site
                    return site
            frame = frame.f_back
        return 0, 0, 0, api_file, api_line

    def _code_info(self, code: CodeType) -> tuple[bool, bool, int, int, CodeType]:
        path = code.co_filename
        return (
            paths.is_wrapper_file(path),
            paths.is_internal_file(path),
            self._intern(path),
            self._intern(code.co_qualname if sys.version_info >= (3, 11) else code.co_name),
            code,
        )


def _sig(dtype: Any, shape: Any) -> str:
    name = str(dtype).rpartition(".")[2]
    return f"{name}[{','.join(str(int(d)) for d in shape)}]"
