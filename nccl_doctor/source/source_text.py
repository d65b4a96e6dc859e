"""Reading the source files of a run's frames for analysis: checked against the fingerprints
recorded with the run, decoded as Python decodes them, bounded, each read at most once per report;
and the parsed text of the one definition a frame is in.

A report names frames in library files of thousands of lines (transformers' trainer.py is ~5,000):
parsing a whole file costs tens of ms, so ``Sources.region`` finds the definition by indentation
and parses only its text, with the file's line numbers kept. ``ast`` and ``tokenize`` are imported
only when first needed: ``digest`` is what the rank's recorder imports, and it must stay cheap.
"""

from __future__ import annotations

import hashlib
import os
import re
from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable, Hashable, Mapping, TypeVar

if TYPE_CHECKING:
    import ast

__all__ = ["digest", "Region", "SourceFile", "Sources"]

T = TypeVar("T")

DIGEST_BYTES = 16  # 128 bits: an edited file must not pass for the one that ran

# A def or class header (after the indentation), the name captured.
_HEADER = re.compile(r"(?:async[ \t]+)?(?:def|class)[ \t]+(\w+)")
# Lines that close a bracket opened above: continuation, never the start of a statement.
_CLOSERS = ")]}"
# How far above a def to look for its decorators (their arguments may run over many lines).
_DECORATOR_SPAN = 400


def digest(data: bytes) -> str:
    """The fingerprint of a source file's bytes: ``blake2b:<32 hex digits>``."""
    return "blake2b:" + hashlib.blake2b(data, digest_size=DIGEST_BYTES).hexdigest()


@dataclass(frozen=True)
class SourceFile:
    path: str
    text: str | None  # None: not analysed, ``why`` says why
    why: str = ""


@dataclass(frozen=True)
class Region:
    """The parsed text of one definition, or of the whole file; line numbers are the file's."""
    path: str
    node: ast.AST  # a FunctionDef/AsyncFunctionDef/ClassDef, or the file's ast.Module
    whole_file: bool


class Sources:
    """One per report: each file read at most once (cached), bounded (``max_bytes`` a file,
    ``max_files`` distinct files).

    ``digests``: path -> the digest recorded with the run. With ``verify`` a file is analysed
    only when its bytes still have that digest (the source that ran); ``verify=False`` is for an
    analysis at the run itself, where the file on disk is the one running.
    """

    def __init__(self, digests: Mapping[str, str] | None = None, *, verify: bool = True,
                 max_bytes: int = 2_000_000, max_files: int = 64,
                 read: Callable[[str], bytes] | None = None) -> None:
        self._digests = dict(digests or {})
        self._verify = verify
        self._max_bytes = max_bytes
        self._max_files = max_files
        self._read = read
        self._files: dict[str, SourceFile] = {}
        self._lines: dict[str, tuple[str, ...]] = {}
        self._regions: dict[tuple[str, int, str | None], Region | str] = {}
        self._parsed: dict[tuple[str, tuple[int, int, int] | None], ast.AST | str] = {}
        self._memo: dict[Hashable, object] = {}
        self._reads = 0

    def get(self, path: str) -> SourceFile:
        """The file's text, or None and why not. Never raises."""
        found = self._files.get(path)
        if found is None:
            found = self._files[path] = self._load(path)
        return found

    def lines(self, path: str) -> tuple[str, ...]:
        """The file's lines (``lines[n - 1]`` is line n, no line ends); empty when not analysed.
        Split only at the line ends Python's tokenizer counts (not at form feeds or U+2028)."""
        found = self._lines.get(path)
        if found is None:
            text = self.get(path).text
            found = () if text is None else tuple(
                text.replace("\r\n", "\n").replace("\r", "\n").split("\n"))
            self._lines[path] = found
        return found

    def region(self, path: str, line: int, name: str | None) -> Region | str:
        """The definition named ``name`` whose block holds ``line`` (its decorators included),
        parsed alone; the whole file when ``name`` is None or the definition cannot be found or
        parsed alone. A string says why there is none. Never raises."""
        key = (path, line, name)
        found = self._regions.get(key)
        if found is None:
            found = self._regions[key] = self._region(path, line, name)
        return found

    def memo(self, key: Hashable, make: Callable[[], T]) -> T:
        """A value derived from these sources (an analysis's index of a file), made once per
        report."""
        if key not in self._memo:
            self._memo[key] = make()
        return self._memo[key]  # type: ignore[return-value]

    # -- reading ---------------------------------------------------------------------------

    def _load(self, path: str) -> SourceFile:
        if not path or (path.startswith("<") and path.endswith(">")):
            return SourceFile(path, None, "no source file")
        expected = self._digests.get(path)
        if self._verify and expected is None:
            return SourceFile(path, None, "no fingerprint recorded with the run")
        if self._reads >= self._max_files:
            return SourceFile(path, None, f"more than {self._max_files} source files in one report")
        self._reads += 1
        try:
            if self._read is None:
                size = os.stat(path).st_size
                if size > self._max_bytes:  # not read at all
                    return SourceFile(path, None, f"too large ({size} bytes)")
                with open(path, "rb") as f:
                    data = f.read(self._max_bytes + 1)
            else:
                data = self._read(path)
        except FileNotFoundError:
            return SourceFile(path, None, "source missing")
        except OSError as exc:
            return SourceFile(path, None, exc.strerror or str(exc) or "source unreadable")
        except Exception as exc:  # a caller's ``read`` may fail any way
            return SourceFile(path, None, f"source unreadable ({type(exc).__name__})")
        if len(data) > self._max_bytes:
            return SourceFile(path, None, f"too large ({len(data)} bytes)")
        if self._verify and digest(data) != expected:
            return SourceFile(path, None, "source changed since the run")
        return _decode(path, data)

    # -- parsing ---------------------------------------------------------------------------

    def _region(self, path: str, line: int, name: str | None) -> Region | str:
        lines = self.lines(path)
        if not lines:
            return self.get(path).why or "empty file"
        if line < 1:
            return "no line number"
        count = len(lines) - 1 if lines[-1] == "" else len(lines)  # a last line end ends no line
        if line > count:
            return f"line {line} is beyond the end of the file ({count} lines)"
        if name is not None:
            span = _locate(lines, line, name)
            if span is not None:
                first, header, indent = span
                tries = [span] if first == header else [span, (header, header, indent)]
                for attempt in tries:
                    node = self._parse(path, attempt)
                    if not isinstance(node, str) and _holds(node, name, line):
                        return Region(path, node, whole_file=False)
        # Not found by indentation (a string or continuation line fooled the scan) or module
        # level: the whole file, which costs more but is exact.
        tree = self._parse(path, None)
        if isinstance(tree, str):
            return tree
        return Region(path, tree, whole_file=True)

    def _parse(self, path: str, span: tuple[int, int, int] | None) -> ast.AST | str:
        """The definition at ``span`` (first line, header line, indent), else the whole file;
        a string: why it did not parse."""
        key = (path, span)
        found = self._parsed.get(key)
        if found is not None:
            return found
        import ast
        lines = self.lines(path)
        if span is None:
            source = "\n".join(lines)
        else:
            first, header, indent = span
            text = "\n".join(lines[first - 1:_block_end(lines, header, indent)])
            # Line numbers kept by padding with empty lines (the tokenizer skips them in C);
            # an indented block parses under ``if 1:`` without dedenting it.
            if indent:
                source = "\n" * (first - 2) + "if 1:\n" + text + "\n"
            else:
                source = "\n" * (first - 1) + text + "\n"
        try:
            tree = ast.parse(source)
            result: ast.AST | str = tree
            if span is not None:
                result = tree.body[0]
                if span[2]:
                    result = result.body[0]  # type: ignore[attr-defined]
        except SyntaxError as exc:
            result = f"syntax error at line {exc.lineno}: {exc.msg}"
        except (ValueError, RecursionError, MemoryError, IndexError) as exc:
            result = f"not parsed ({type(exc).__name__}: {exc})"
        self._parsed[key] = result
        return result


def _decode(path: str, data: bytes) -> SourceFile:
    """Decoded as the interpreter does: a BOM or PEP 263 coding cookie, else UTF-8."""
    import io
    import tokenize
    try:
        encoding, _ = tokenize.detect_encoding(io.BytesIO(data).readline)
        declared = "UTF-8" if encoding in ("utf-8", "utf-8-sig") else encoding
    except SyntaxError as exc:
        if not str(exc.msg).startswith("invalid or missing encoding declaration"):
            return SourceFile(path, None, f"not decodable: {exc.msg}")  # an unknown encoding
        encoding, declared = "utf-8", "UTF-8"  # bytes not UTF-8 in the first two lines
    try:
        return SourceFile(path, data.decode(encoding))
    except UnicodeDecodeError as exc:
        what = "no coding declaration" if declared == "UTF-8" else "its declared encoding"
        return SourceFile(path, None, f"not {declared} at byte {exc.start} ({what})")
    except LookupError as exc:
        return SourceFile(path, None, f"not decodable: {exc}")


def _indent(text: str) -> tuple[int, str]:
    stripped = text.lstrip(" \t\f")
    return len(text) - len(stripped), stripped


def _locate(lines: tuple[str, ...], line: int, name: str) -> tuple[int, int, int] | None:
    """(first line, header line, indent) of the definition ``name`` whose block holds ``line``, its
    decorators included, found by indentation alone: None when the scan does not find it."""
    level, stripped = _indent(lines[line - 1])
    match = _HEADER.match(stripped)
    if match and match.group(1) == name:  # the frame is on the header itself
        start = line
    else:
        if not stripped:
            level = 1 << 30
        start = 0
        for n in range(line - 1, 0, -1):
            indent, stripped = _indent(lines[n - 1])
            if not stripped or stripped[0] == "#" or stripped[0] in _CLOSERS or indent >= level:
                continue
            level = indent
            match = _HEADER.match(stripped)
            if match and match.group(1) == name:
                start = n
                break
            if indent == 0:
                return None
        if not start:
            return None
    indent, _ = _indent(lines[start - 1])
    first = start
    # Decorators: ``@`` lines at the def's indentation above it, their arguments possibly over
    # many lines (even at column 0 in a string); stop at the definition before or the block
    # around. A wrong guess does not parse, and the caller then parses from the def alone.
    for n in range(start - 1, max(0, start - _DECORATOR_SPAN), -1):
        level, stripped = _indent(lines[n - 1])
        if not stripped or stripped[0] == "#" or level > indent:
            continue
        if level < indent or _HEADER.match(stripped):
            break
        if stripped[0] == "@":
            first = n
    if indent and first == 1:
        return None
    return first, start, indent


def _block_end(lines: tuple[str, ...], header: int, indent: int) -> int:
    """The last line of the definition whose header is line ``header``: before the next
    statement at its indentation or less (the closing brackets of a multi-line signature do not
    end it)."""
    last = header
    for n in range(header + 1, len(lines) + 1):
        level, stripped = _indent(lines[n - 1])
        if not stripped or stripped[0] == "#":
            continue
        if level <= indent and stripped[0] not in _CLOSERS:
            break
        last = n
    return last


def _holds(node: ast.AST, name: str, line: int) -> bool:
    """Whether a parsed region is the definition sought and holds the frame's line."""
    return (getattr(node, "name", None) == name
            and getattr(node, "lineno", 0) <= line <= (getattr(node, "end_lineno", 0) or 0))
