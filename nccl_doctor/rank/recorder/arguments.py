"""Cheap, cached descriptions of call arguments and callsites for the recorder's hot path."""

from __future__ import annotations

import functools
import sys
from types import CodeType, FrameType
from typing import Any, Callable, Mapping

from nccl_doctor import paths
from nccl_doctor.files import source_digest
from nccl_doctor.rank.recorder.passes_on import passes_on, read_source

_UNIFORM_CHECK_LIMIT = 16  # lists longer than this are described by their first member
CACHE_LIMIT = 4096  # entries per cache; a full cache is emptied and fills again from the calls
#: Frames a call path keeps: the innermost ones outside torch, from the frame that called
#: torch.distributed outward to the user's (capture/_ring.c's PATH_FRAMES is the same number).
PATH_FRAMES = 16


class Describer:
    """Interns tensor descriptions and callsites through ``intern`` (the capture's string table).

    Its caches are read on every call (by the Python path and by the C fast path of
    capture/_ring.c, which sees the same dicts): they are only ever emptied in place, never
    replaced, and each holds at most CACHE_LIMIT entries.
    """

    def __init__(self, intern: Callable[[str], int],
                 note: Callable[..., bool] | None = None) -> None:
        self._intern = intern
        self._note = note  # the capture's JSON notes: each new file's fingerprint and package
        self._files: set[str] = set()  # the files noted (each once per process)
        self._packages: set[str] = set()
        # (dtype, shape), (n, dtype, shape) or a constant -> (string id, bytes). The recorder's
        # hot path reads it directly before calling ``tensor``.
        self.tensors: dict[Any, tuple[int, int]] = {}
        # Keyed by (id(code), f_lasti): hashing a code object hashes its whole body. Each value
        # holds its code object, so that no other code object can take its id while it is there;
        # ``positions``, ``direct`` and ``_code`` are emptied together for the same reason.
        # Any frame a callsite walk met -> (library, internal, file id, line, function id, code):
        self.positions: dict[tuple[int, int], tuple[bool, bool, int, int, int, CodeType]] = {}
        # A caller in the user's own code -> its ``callsites`` answer: the Python hot path's first
        # look-up, which saves walking the stack when torch is called directly. Its keys are
        # also in ``positions``.
        self.direct: dict[tuple[int, int], tuple[int, int, int, int, int, int]] = {}
        # The positions' keys of a call path's frames (innermost first) -> the path's string id
        # (``path_text``): interned once per distinct path, read by the C fast path too.
        self.paths: dict[tuple[tuple[int, int], ...], int] = {}
        self._code: dict[int, tuple[bool, bool, int, int, CodeType]] = {}

    # -- tensors -----------------------------------------------------------------------------
    def tensor(self, t: Any) -> tuple[int, int]:
        """(string id of the description, bytes) for a tensor, a list of tensors, or an object."""
        shape = getattr(t, "shape", None)
        if shape is not None:
            key = (t.dtype, shape)
            found = self.tensors.get(key)
            if found is None:  # (id, bytes): bytes follow from dtype and shape
                found = self._remember(key, (self._intern(_sig(t.dtype, shape)), t.nbytes))
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
            found = self._remember(
                key, (self._intern(f"{n}*{_sig(first.dtype, shape)}"), first.nbytes * n)
            )
        return found

    def _intern_const(self, text: str) -> int:
        found = self.tensors.get(text)
        if found is None:
            found = self._remember(text, (self._intern(text), 0))
        return found[0]

    def _remember(self, key: Any, found: tuple[int, int]) -> tuple[int, int]:
        if len(self.tensors) >= CACHE_LIMIT:
            self.tensors.clear()
        self.tensors[key] = found
        return found

    # -- callsites ---------------------------------------------------------------------------
    def callsites(self, frame: FrameType | None) -> tuple[int, int, int, int, int, int]:
        """(user file, line, function, api file, api line, path) string ids / numbers.

        The user callsite is the first frame outside library code (``paths.is_library_file``:
        installed code, torch and nccl-doctor); the API callsite is the first frame outside
        torch (it may be in accelerate or trl); the path is every frame outside torch from the
        API callsite out to the user's, at most PATH_FRAMES of them (the library line that
        decided to make the call is among them: the analysis picks it), each marked when it
        only passes its call on (``passes_on``) or was called by torch (a hook, a decorator of
        torch's): both tell the analysis which line issued the call. What a frame contributes
        is cached by (code, instruction offset): ``f_lineno`` decodes the line table each time,
        and the file tests are regular expressions.
        """
        api_file = api_line = 0
        positions = self.positions
        first = frame
        keys: list[tuple[int, int]] = []
        places: list[list[Any]] = []  # [file, line, function, library, code, lasti, by torch]
        site = None
        torch_between = False  # an internal frame walked since the last frame kept
        while frame is not None:
            key = (id(frame.f_code), frame.f_lasti)
            library, internal, file, line, function, _code = (
                positions.get(key) or self._position(frame, key)
            )
            if not internal:
                if not api_file:
                    api_file, api_line = file, line
                if len(keys) < PATH_FRAMES:
                    if torch_between and places:
                        places[-1][6] = True
                    keys.append(key)
                    places.append([file, line, function, library, frame.f_code, key[1], False])
                torch_between = False
                if not library:
                    site = file, line, function
                    break
            elif places:
                torch_between = True
            frame = frame.f_back
        path_key = tuple(keys)
        path = self.paths.get(path_key)
        if path is None:
            path = self._intern(path_text(_flagged(places)))
            # kept only while every frame's code is held by ``positions`` (a walk that filled it
            # up emptied it on the way): no other code object can then take one of these ids
            if all(k in positions for k in path_key):
                if len(self.paths) >= CACHE_LIMIT:
                    self.paths.clear()
                self.paths[path_key] = path
        found = (*(site or (0, 0, 0)), api_file, api_line, path)
        if site is not None and frame is first:  # depends on this frame alone: remember it
            self.direct[keys[0]] = found
        return found

    def _position(self, frame: FrameType, key: tuple[int, int]) -> tuple:
        if len(self.positions) >= CACHE_LIMIT:
            self.forget_frames()
        code = frame.f_code
        info = self._code.get(key[0])
        if info is None:
            info = self._code[key[0]] = self._code_info(code)
        found = self.positions[key] = (
            info[0], info[1], info[2], frame.f_lineno or 0, info[3], code
        )
        return found

    def forget_frames(self) -> None:
        """Empty the caches keyed by code objects' ids (together: see ``__init__``)."""
        self.direct.clear()
        self.positions.clear()
        self.paths.clear()
        self._code.clear()

    def _code_info(self, code: CodeType) -> tuple[bool, bool, int, int, CodeType]:
        path = code.co_filename
        library, internal = paths.is_library_file(path), paths.is_internal_file(path)
        if not internal and _compiled_by_dynamo(code):  # torch.compile's rewrite of the user's
            library = internal = True  # function: its caller's line is the user's
        if not internal and path not in self._files and self._note is not None:
            self._note_file(path, library)
        return (
            library, internal, self._intern(path),
            self._intern(code.co_qualname if sys.version_info >= (3, 11) else code.co_name),
            code,
        )

    def _note_file(self, path: str, library: bool) -> None:
        """Note a file met on a call path for the first time: its fingerprint (the analysis
        reads its source for the branch on the rank only while it is unchanged) and, for an
        installed file, its package's version. Once per file; at most MAX_FILES files."""
        if len(self._files) >= MAX_FILES:
            return
        self._files.add(path)
        fields: dict[str, Any] = {}
        data = read_source(path, MAX_SOURCE_BYTES)
        if data is not None:
            fields["sources"] = {path: source_digest(data)}
        package = paths.package_of(path) if library else None
        if package is not None and package not in self._packages:
            self._packages.add(package)
            version = package_version(package)
            if version is not None:
                fields["versions"] = {package: version}
        if fields and self._note is not None:
            self._note("code", share=CODE_SHARE, **fields)


def _compiled_by_dynamo(code: CodeType) -> bool:
    """A code object torch.compile wrote in place of a user's function (it keeps the function's
    file and name; its every instruction says the ``def`` line). Asked once per code object."""
    utils = sys.modules.get("torch._dynamo.utils")
    transformed = getattr(utils, "orig_code_map", None) if utils is not None else None
    try:
        return transformed is not None and code in transformed
    except Exception:  # noqa: BLE001 - torch's own map: not knowing is "not compiled"
        return False


def _flagged(places: list[list[Any]]) -> list[tuple[int, int, int, str]]:
    """Each kept frame as (file, line, function, flags): ``p`` for a library frame that only
    passes its call on, ``t`` for one called by torch (asked once per new path)."""
    out = []
    for file, line, function, library, code, lasti, by_torch in places:
        flags = "p" if library and passes_on(code, lasti) else ""
        out.append((file, line, function, flags + ("t" if by_torch else "")))
    return out


def path_text(places: list[tuple[int, int, int, str]]) -> str:
    """A call path as the capture keeps it: ``file:line:function`` string ids per frame,
    innermost first, separated by spaces, with ``:flags`` when the frame has some (``p``:
    passes its call on, ``t``: called by torch; capture/records.py reads it back)."""
    return " ".join(f"{f}:{line}:{fn}:{flags}" if flags else f"{f}:{line}:{fn}"
                    for f, line, fn, flags in places)


MAX_FILES = 1024  # files whose fingerprints a rank notes
MAX_SOURCE_BYTES = 4_000_000  # a larger file is not fingerprinted (nor analysed)
CODE_SHARE = 0.4  # of the string table, the most these notes may fill


def package_version(package: str) -> str | None:
    """The version of the installed top-level package ``package`` (its module's ``__version__``
    when imported, else its distribution's metadata)."""
    module = sys.modules.get(package)
    version = getattr(module, "__version__", None) if module is not None else None
    if isinstance(version, str):
        return version
    from importlib import metadata

    try:
        return metadata.version(package)  # (a distribution named as its package: most)
    except Exception:  # noqa: BLE001 - not one: look it up below
        pass
    try:
        names = _distributions().get(package) or ()
        return metadata.version(names[0]) if names else None
    except Exception:  # noqa: BLE001 - a package without metadata has no version to say
        return None


@functools.lru_cache(maxsize=1)
def _distributions() -> Mapping[str, list[str]]:
    from importlib import metadata

    return metadata.packages_distributions()


def _sig(dtype: Any, shape: Any) -> str:
    name = str(dtype).rpartition(".")[2]
    return f"{name}[{','.join(str(int(d)) for d in shape)}]"
