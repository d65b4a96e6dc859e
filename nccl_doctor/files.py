"""Writing files that other processes read while they change (manifest, report, GPU series),
and reading input files safely (a FIFO or a device named like one is never waited on)."""

from __future__ import annotations

import errno
import os
import stat
from pathlib import Path


def write_atomic(path: Path, text: str, *, encoding: str = "utf-8",
                 mode: int | None = None) -> None:
    """Replace ``path`` with ``text`` in one step: a reader (or a process killed meanwhile)
    never sees half a file. Its newlines are written as they are in ``text``; ``mode``: the
    permissions the new file gets (a source file ``check --fix`` rewrites keeps its own)."""
    tmp = path.with_name(f".{path.name}.tmp")
    try:
        with open(tmp, "w", encoding=encoding, newline="") as out:
            out.write(text)
        if mode is not None:
            os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def read_regular(path: Path, limit: int, *, tail: bool = False) -> bytes:
    """Up to ``limit`` bytes of the regular file ``path`` (its last ``limit`` with ``tail``).
    Raises ``FileNotFoundError`` when it is absent and ``OSError`` when it is unreadable or not
    a regular file: opened without blocking, so a FIFO named like an input never hangs."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_NOCTTY", 0))
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise OSError(errno.EINVAL, "not a regular file", str(path))
        if tail and st.st_size > limit:
            os.lseek(fd, st.st_size - limit, os.SEEK_SET)
        chunks, left = [], limit
        while left > 0:
            chunk = os.read(fd, min(left, 1 << 20))
            if not chunk:
                break
            chunks.append(chunk)
            left -= len(chunk)
        return b"".join(chunks)
    finally:
        os.close(fd)


def source_digest(data: bytes) -> str:
    """A source file's fingerprint, as a rank records it for each file on its call paths and
    the analysis checks before reading that file's source again: ``blake2b:<32 hex digits>``."""
    import hashlib

    return "blake2b:" + hashlib.blake2b(data, digest_size=16).hexdigest()
