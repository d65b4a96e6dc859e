"""Which source files are library code and which are the user's (for callsites).

A frame is **library code** when its file is installed: under site-packages or dist-packages,
in the standard library, a console script in an interpreter's ``bin/``, inside a zip import, or
frozen - as error trackers decide which frames are the app's. torch and nccl-doctor are always
library code. Everything else is the user's, their own package installed editable included.
Patterns override the rule (``nccl-doctor run --user-code/--library-code``, env
``NCCL_DOCTOR_USER_CODE``/``NCCL_DOCTOR_LIBRARY_CODE``, the pytest plugin's ini options):
``configure``.

Used by the recorder's hot path (through a per-code-object cache) and by the readers of stacks.
"""

from __future__ import annotations

import fnmatch
import functools
import os
import re
import sys
from typing import Iterable, Mapping, Sequence

#: Environment twins of ``--user-code`` / ``--library-code``: patterns separated by os.pathsep.
USER_CODE_ENV = "NCCL_DOCTOR_USER_CODE"
LIBRARY_CODE_ENV = "NCCL_DOCTOR_LIBRARY_CODE"
_INTERNAL = ("torch", "nccl_doctor")  # always library code, never even the direct API caller

_SEP = re.escape(os.sep)


def _pattern(packages: tuple[str, ...]) -> re.Pattern[str]:
    names = "|".join(re.escape(p) for p in packages)
    return re.compile(rf"{_SEP}(?:{names}){_SEP}|^<frozen |^<string>$")


_INTERNAL_RE = _pattern(_INTERNAL)
# nccl_doctor.plugins is installed from the repository's top-level plugins/ (pyproject.toml's
# package-dir): in an editable install its files lie outside nccl_doctor/, and are ours all the same
_PLUGINS_DIR = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "plugins")
_OWN_DIRS = (_PLUGINS_DIR + os.sep,) if os.path.isfile(
    os.path.join(_PLUGINS_DIR, "known_issues.py")) else ()
_INSTALLED_RE = re.compile(
    rf"{_SEP}(?:site|dist)-packages{_SEP}"  # pip, conda, Debian
    rf"|{_SEP}lib{_SEP}python3\.\d+t?{_SEP}"  # the standard library
    rf"|\.(?:zip|egg|whl|pyz){_SEP}"  # zip imports
    r"|^<")  # frozen modules, exec'd strings

_user_patterns: tuple[str, ...] = ()
_library_patterns: tuple[str, ...] = ()
_prefixes: tuple[str, ...] = ()


def _split(text: str | None) -> tuple[str, ...]:
    return tuple(p for p in (text or "").split(os.pathsep) if p.strip())


def configure(user_code: Iterable[str] = (), library_code: Iterable[str] = (),
              prefixes: Iterable[str] = ()) -> None:
    """Set the override patterns (each an ``fnmatch`` pattern on the absolute path, ``*``
    spanning directories, or a directory: every file below it) and interpreter prefixes beyond
    this one's (a rank's, recorded in its capture: its console scripts are library code).
    A file matching both kinds of pattern is library code."""
    global _user_patterns, _library_patterns, _prefixes
    _user_patterns = tuple(_pattern_of(p) for p in user_code)
    _library_patterns = tuple(_pattern_of(p) for p in library_code)
    own = {sys.prefix, sys.base_prefix, sys.exec_prefix, sys.base_exec_prefix}
    _prefixes = tuple(sorted({os.path.join(p, d) + os.sep for p in (*own, *prefixes) if p
                              for d in ("bin", "Scripts")}))
    is_library_file.cache_clear()  # (is_internal_file does not depend on them)


def with_patterns(environ: Mapping[str, str], user_code: Iterable[str] = (),
                  library_code: Iterable[str] = ()) -> dict[str, str]:
    """``environ`` with patterns added to its ``USER_CODE_ENV``/``LIBRARY_CODE_ENV`` (where the
    ranks' recorders, and this process through ``configure_from``, read them)."""
    out = dict(environ)
    for name, more in ((USER_CODE_ENV, list(user_code)), (LIBRARY_CODE_ENV, list(library_code))):
        if more:
            out[name] = os.pathsep.join([*_split(out.get(name)), *more])
    return out


def configure_from(environ: Mapping[str, str], prefixes: Iterable[str] = ()) -> None:
    """``configure`` with the patterns ``environ`` holds (a job's, or a rank's recorded one)."""
    configure(_split(environ.get(USER_CODE_ENV)), _split(environ.get(LIBRARY_CODE_ENV)),
              prefixes)


def patterns() -> tuple[tuple[str, ...], tuple[str, ...]]:
    """(user code, library code) override patterns in force."""
    return _user_patterns, _library_patterns


def _pattern_of(text: str) -> str:
    text = text.strip()
    if not any(c in text for c in "*?["):  # a directory (or one file): everything below it
        return os.path.abspath(os.path.expanduser(text)).rstrip(os.sep) + "*"
    return text


def _matches(path: str, pats: Sequence[str]) -> bool:
    return any(fnmatch.fnmatchcase(path, p) for p in pats)


@functools.lru_cache(maxsize=8192)
def is_library_file(path: str) -> bool:
    """True for installed code (module docstring), torch and nccl-doctor; False for the user's.
    Cached per file: the recorder asks once per code object, the readers once per frame."""
    if is_internal_file(path):
        return True
    if _is_user_copy(path):
        return False
    if _library_patterns and _matches(path, _library_patterns):
        return True
    if _user_patterns and _matches(path, _user_patterns):
        return False
    return bool(_INSTALLED_RE.search(path)) or path.startswith(_prefixes)


def is_user_file(path: str) -> bool:
    """The user's own code: not library code (``is_library_file``)."""
    return not is_library_file(path)


@functools.lru_cache(maxsize=8192)
def is_internal_file(path: str) -> bool:
    """True for torch, nccl_doctor and frozen frames, and for the code torch generates (an FX
    graph's ``<eval_with_key>``, an Inductor-compiled module): never the direct caller worth
    naming."""
    return _belongs(path, _INTERNAL_RE, _INTERNAL) or bool(_GENERATED_RE.search(path))


# torch.compile's code: FX graph modules, and Inductor's output modules (in its cache,
# /tmp/torchinductor_<user> unless TORCHINDUCTOR_CACHE_DIR moves it: a two-character directory
# holding c<52-character hash>.py)
_GENERATED_RE = re.compile(rf"^<eval_with_key>|{_SEP}torchinductor_[^{_SEP}]*{_SEP}"
                           rf"|{_SEP}[a-z0-9]{{2}}{_SEP}c[a-z0-9]{{51}}\.py$")


def _belongs(path: str, pattern: re.Pattern[str], packages: tuple[str, ...]) -> bool:
    """An installed file belongs to the top-level package it is installed as (so
    ray/train/torch/config.py is Ray's, not torch's); any other file by a directory of one of
    ``packages``' names on its path (a source checkout of torch)."""
    if _is_own(path):
        return True
    if _is_user_copy(path):
        return False
    package = package_of(path)
    if package is not None:
        return package in packages
    return bool(pattern.search(path))


_DOCTOR_RE = re.compile(rf"{_SEP}nccl_doctor{_SEP}")


def is_doctor_file(path: str) -> bool:
    """True for nccl-doctor's own code (its recorder's wrappers, the in-rank agent, the capture
    writer they call), not for the example, reproducer and trainer programs it ships: in a rank's
    stack its frames are never where the user's program is, only where the doctor sits around it."""
    return (bool(_DOCTOR_RE.search(path)) and not _is_user_copy(path)) or _is_own(path)


def _is_own(path: str) -> bool:
    return bool(_OWN_DIRS) and path.startswith(_OWN_DIRS)


_STDLIB_RE = re.compile(rf"{_SEP}lib{_SEP}python3\.\d+{_SEP}(?!(?:site|dist)-packages{_SEP})")


def is_stdlib_file(path: str) -> bool:
    """True for the standard library of any CPython 3 install (threading.py, queue.py, ...)."""
    return bool(_STDLIB_RE.search(path))


_PACKAGE_RE = re.compile(rf"{_SEP}(?:site|dist)-packages{_SEP}([A-Za-z_][A-Za-z0-9_]*)")


@functools.lru_cache(maxsize=4096)
def package_of(path: str) -> str | None:
    """The installed top-level package a file belongs to (``trl`` for
    .../site-packages/trl/trainer/cpo_trainer.py); None for a file not installed as one (the
    user's own code, an editable checkout)."""
    m = _PACKAGE_RE.search(path)
    return m.group(1) if m else None


_USER_COPIES = tuple(f"{os.sep}nccl_doctor{os.sep}{d}{os.sep}"
                     for d in ("examples", "reproducers", "trainers"))


def _is_user_copy(path: str) -> bool:
    # nccl_doctor ships example programs, reproducers and reference trainers; they are "user
    # code" for callsites.
    return any(d in path for d in _USER_COPIES)


# the repository's top-level reproducers/, installed as nccl_doctor.reproducers (an editable
# install runs them from there)
_REPRODUCERS_DIR = os.path.join(os.path.dirname(_PLUGINS_DIR), "reproducers") + os.sep


def shipped(path: str) -> bool:
    """One of nccl-doctor's own example programs, reproducers or reference trainers: user code
    to the analysis (their lines are blamed as a user's), but not the user's."""
    return _is_user_copy(path) or (bool(_OWN_DIRS) and path.startswith(_REPRODUCERS_DIR))


def owner(path: str) -> str:
    """Whose a line of user code is, as a report says it: "your", or "nccl-doctor's" for its
    own examples, reproducers and trainers (the demo's)."""
    return "nccl-doctor's" if shipped(path) else "your"


def whose(path: str) -> str:
    """``owner`` and a space before a line of user code; "" before library code."""
    return f"{owner(path)} " if is_user_file(path) else ""


#: where an installed file's package root is: the last site-packages or dist-packages on its
#: path, else the standard library's directory (lib/python3.X)
_ROOTS = (re.compile(rf"{_SEP}(?:site|dist)-packages{_SEP}"),
          re.compile(rf"{_SEP}lib{_SEP}python3\.\d+t?{_SEP}"))


def short_path(path: str, cwd: str | None = None) -> str:
    """A source file as the reports print it (the *short form*): an installed file from its
    package root (``.../site-packages/trl/trainer/x.py`` -> ``trl/trainer/x.py``,
    ``.../lib/python3.11/threading.py`` -> ``threading.py``), a file below ``cwd`` (default: the
    working directory) relative to it (``train.py``), any other as recorded. A ``path:line`` is
    shortened the same way (``/work/train.py:15`` -> ``train.py:15`` in /work): the
    ``callsite`` columns of ``nccl_doctor.open`` hold the absolute form."""
    return _short_path(path, cwd or os.getcwd())


@functools.lru_cache(maxsize=4096)
def _short_path(path: str, cwd: str) -> str:  # (reports name the same few files thousands of times)
    if os.path.isabs(path):
        for root in _ROOTS:
            found = list(root.finditer(path))
            if found and found[-1].end() < len(path):
                return path[found[-1].end():]
    try:
        rel = os.path.relpath(path, cwd)
    except ValueError:
        return path
    return path if rel.startswith("..") else rel


configure_from(os.environ)
