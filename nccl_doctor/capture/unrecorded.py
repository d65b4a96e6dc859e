"""Ranks that ran but could not be recorded (``<stem>.unrecorded``, format.UNRECORDED_SUFFIX).

A rank whose capture file cannot be made (no room on the disk: the file is reserved whole; no
permission) disables its recorder and goes on. It leaves this small JSON file in the capture's
place when it can, so that the analysis knows the rank reached ``init_process_group`` and ran
unseen: it is then never "missing" from a collective, and the report says why it is not there.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from nccl_doctor.capture import format as fmt

__all__ = ["MAX_BYTES", "read_unrecorded", "write_unrecorded"]

MAX_BYTES = 16 * 1024  # a marker is a few hundred bytes: a bigger file is not ours


def write_unrecorded(directory: Path, stem: str, rank: int, world_size: int, host: str,
                     why: str) -> Path | None:
    """Leave the marker of an unrecorded rank; None when even that cannot be written."""
    path = directory / f"{stem}{fmt.UNRECORDED_SUFFIX}"
    body = json.dumps({"rank": rank, "world_size": world_size, "host": host,
                       "pid": os.getpid(), "why": why[:500]}, sort_keys=True).encode()
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        try:
            os.write(fd, body)
        finally:
            os.close(fd)
    except OSError:
        return None
    return path


def read_unrecorded(directory: Path) -> tuple[dict[int, dict], list[str]]:
    """(rank -> its marker's fields, problems) for the markers in ``directory``; a marker that
    cannot be read is a problem, never the end of the replay."""
    found: dict[int, dict] = {}
    problems: list[str] = []
    for path in sorted(directory.glob(f"*{fmt.UNRECORDED_SUFFIX}")):
        try:
            with open(path, "rb") as fh:
                raw = fh.read(MAX_BYTES + 1)
            doc = json.loads(raw) if len(raw) <= MAX_BYTES else None
        except (OSError, ValueError):
            doc = None
        rank = doc.get("rank") if isinstance(doc, dict) else None
        if not isinstance(rank, int) or isinstance(rank, bool) or rank < 0:
            problems.append(f"{path.name} skipped: not an nccl-doctor marker of an unrecorded "
                            "rank")
            continue
        found[rank] = {"why": str(doc.get("why", "")), "host": str(doc.get("host", "")),
                       "world_size": doc.get("world_size") if isinstance(
                           doc.get("world_size"), int) else 0}
    return found, problems
