"""Ranks that ran but could not be recorded (``<stem>.unrecorded``, format.UNRECORDED_SUFFIX).

A rank whose capture file cannot be made (no room on the disk: the file is reserved whole; a
file-size limit; no permission to write a file there) disables its recorder and goes on. It
leaves this small file in the capture's place when it can, so that the analysis knows the rank
reached ``init_process_group`` and ran unseen: it is then never "missing" from a collective, and
the report says why it is not there.

The file's name is the capture's (``rankNNNNN.HOST.PID``), so it says the rank by itself: on a
full disk the file can be created (an inode) but its JSON body may not fit, and an empty or cut
marker still counts. The body adds the world size and why.
"""

from __future__ import annotations

import json
import os
import re
import stat
from pathlib import Path
from typing import TYPE_CHECKING

from nccl_doctor.capture import format as fmt
from nccl_doctor.capture.format import MAX_WORLD
from nccl_doctor import bounded_json
from nccl_doctor.files import read_regular

if TYPE_CHECKING:
    from nccl_doctor.model import Unrecorded

__all__ = ["MAX_BYTES", "MAX_HOST", "MAX_WHY", "MAX_WORLD", "kept", "read_unrecorded",
           "write_unrecorded"]

MAX_BYTES = 16 * 1024  # a marker is a few hundred bytes: a bigger file is not ours
# (a world size or rank above this in a marker is not believed: spelled with the format)
MAX_WHY = 500  # characters of the reason kept (it is one line)
MAX_HOST = 200  # characters of the host name kept
_NAME = re.compile(r"rank(\d{5,7})\.[^/]*" + re.escape(fmt.UNRECORDED_SUFFIX))
UNKNOWN = "its capture could not be made (its marker is empty or cut: a full disk?)"


def write_unrecorded(directory: Path, stem: str, rank: int, world_size: int, host: str,
                     why: str) -> Path | None:
    """Leave the marker of an unrecorded rank (``stem``: its capture's name without the suffix);
    None when not even its name can be made. A body that does not fit is left cut or empty."""
    path = directory / f"{stem}{fmt.UNRECORDED_SUFFIX}"
    body = json.dumps({"rank": rank, "world_size": world_size, "host": host,
                       "pid": os.getpid(), "why": why[:MAX_WHY]}, sort_keys=True).encode()
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    except OSError:
        return None
    try:
        os.write(fd, body)
    except OSError:
        pass  # the name says the rank
    finally:
        os.close(fd)
    return path


def kept(why: str, host: str) -> Unrecorded:
    """An unrecorded rank as the analysis keeps it, from a marker or a node's summary: its
    reason and host cut to their bounds."""
    from nccl_doctor.model import Unrecorded  # (a rank writes: no model)

    return Unrecorded(why[:MAX_WHY], host[:MAX_HOST])


def read_unrecorded(directory: Path) -> tuple[dict[int, tuple[Unrecorded, int]], list[str]]:
    """(rank -> (what its marker says, its world size or 0), problems) for the markers in
    ``directory``. A file of that suffix that is not a marker (not a regular file, not named for
    a rank) is a problem, never the end of the replay; a marker's body that cannot be read
    leaves its name."""
    found: dict[int, tuple[Unrecorded, int]] = {}
    problems: list[str] = []
    for path in sorted(directory.glob(f"*{fmt.UNRECORDED_SUFFIX}")):
        named = _NAME.fullmatch(path.name)
        try:
            regular = stat.S_ISREG(path.lstat().st_mode)  # never open a FIFO: it would block
        except OSError:
            regular = False
        if named is None or not regular or int(named.group(1)) >= MAX_WORLD:
            problems.append(f"{path.name} skipped: not an nccl-doctor marker of an unrecorded "
                            "rank")
            continue
        rank = int(named.group(1))
        doc = _body(path)
        if doc.get("rank") != rank:  # empty, cut, or not this rank's: the name alone
            doc = {}
        world = doc.get("world_size")
        if not isinstance(world, int) or isinstance(world, bool) or not rank < world <= MAX_WORLD:
            world = 0
        found[rank] = kept(str(doc.get("why") or UNKNOWN), str(doc.get("host", ""))), world
    return found, problems


def _body(path: Path) -> dict:
    try:
        raw = read_regular(path, MAX_BYTES + 1)
        doc = bounded_json.loads(raw, limit=MAX_BYTES) if raw else {}
    except (OSError, ValueError):
        return {}
    return doc if isinstance(doc, dict) else {}
