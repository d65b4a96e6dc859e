"""Ranks on their way into ``init_process_group`` (``<stem>.joining``, names.JOINING_SUFFIX).

A rank's capture is made when ``init_process_group`` returns: while the ranks wait in its
rendezvous (for a rank that never comes, or one that went to another address) nothing of them is
on disk, and the watchdog would not know the job had ranks at all. The recorder leaves this
small JSON file as the call begins (rank/recorder/wrappers.py ``wrap_init``), named like a
capture (``rankNNNNN.HOST.PID``): who joins, which world it thinks it joins, and where it
meets the others:

    {"format": "nccl-doctor joining", "version": 1, "rank": 3, "world_size": 4,
     "local_world_size": 4, "host": "node1", "pid": 4242, "time_ns": 1700000000000000000,
     "address": "127.0.0.1:29500", "backend": "gloo"}

``address``: ``MASTER_ADDR:MASTER_PORT``, or the ``init_method`` given ("" when neither is
known). Written whole (a temporary file renamed), bounded (MAX_BYTES); a file that is not one is
skipped, never the end of a look.
"""

from __future__ import annotations

import json
import os
import re
import stat
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterator

from nccl_doctor import bounded_json
from nccl_doctor.capture import early_exit
from nccl_doctor.capture.early_exit import read_attempt, stem
from nccl_doctor.capture.names import JOINING_SUFFIX
from nccl_doctor.capture.unrecorded import MAX_HOST, MAX_WORLD
from nccl_doctor.env import attempt_of
from nccl_doctor.files import read_regular

if TYPE_CHECKING:
    from nccl_doctor.model import Joining

FORMAT = "nccl-doctor joining"
VERSION = 1
MAX_BYTES = 4096
MAX_ADDRESS = 300
_NAME = re.compile(r"rank(\d{5,7})\.[^/]*" + re.escape(JOINING_SUFFIX))


def write_joining(directory: Path, rank: int, world_size: int, host: str, *,
                  local_world_size: int | None, address: str, backend: str,
                  time_ns: int) -> Path | None:
    """Leave the record of a rank beginning ``init_process_group``; None when it cannot be
    made. Never raises."""
    try:
        doc = {"format": FORMAT, "version": VERSION, "rank": rank, "world_size": world_size,
               "local_world_size": local_world_size, "host": host[:MAX_HOST],
               "pid": os.getpid(), "time_ns": time_ns, "address": address[:MAX_ADDRESS],
               "backend": backend[:64], "attempt": list(attempt_of(os.environ))}
        path = directory / f"{stem(rank, host, os.getpid())}{JOINING_SUFFIX}"
        tmp = path.with_name(f".{path.name}.tmp")
        directory.mkdir(parents=True, exist_ok=True)
        try:
            tmp.write_bytes(json.dumps(doc, sort_keys=True).encode())
            os.replace(tmp, path)
        except OSError:
            tmp.unlink(missing_ok=True)
            return None
        return path
    except Exception:  # noqa: BLE001 - inside the user's init_process_group: never raise
        return None


def read_joinings(directory: Path, attempt: tuple[int, int] | None = None
                  ) -> dict[int, Joining]:
    """rank -> the latest record of it beginning ``init_process_group`` in ``directory`` (a
    launcher's restart writes a newer one), of launch ``attempt`` only when one is given.
    Files that are not records are skipped."""
    found: dict[int, Joining] = {}
    for joining in _records(directory):
        if attempt is not None and joining.attempt != attempt:
            continue
        held = found.get(joining.rank)
        if held is None or joining.time_ns >= held.time_ns:
            found[joining.rank] = joining
    return found


def attempts_in(directory: Path) -> dict[tuple[int, int], int]:
    """The launch attempts whose ranks began joining here, each with its earliest time."""
    out: dict[tuple[int, int], int] = {}
    for joining in _records(directory):
        out[joining.attempt] = min(out.get(joining.attempt, joining.time_ns), joining.time_ns)
    return out


def launches_begun(directory: Path) -> dict[tuple[int, int], int | None]:
    """The launch attempts whose ranks began joining, or raised before it, in ``directory``
    (a ranks' attempt known before, or without, any capture), each with its earliest time."""
    out: dict[tuple[int, int], int | None] = {}
    for marks in (early_exit.attempts_in(directory), attempts_in(directory)):
        for key, at in marks.items():
            out[key] = early_exit.earliest(out.get(key), at)
    return out


def _records(directory: Path) -> Iterator[Joining]:
    try:
        paths = sorted(directory.glob(f"*{JOINING_SUFFIX}"))
    except OSError:
        return
    for path in paths:
        named = _NAME.fullmatch(path.name)
        try:
            st = path.lstat()  # never open a FIFO: it would block
        except OSError:
            continue
        if named is None or not stat.S_ISREG(st.st_mode) or st.st_size > MAX_BYTES:
            continue
        try:
            yield _parse(read_regular(path, MAX_BYTES + 1), int(named.group(1)))
        except (OSError, ValueError):
            continue


def _parse(body: bytes, rank: int) -> Joining:
    raw: Any = bounded_json.loads(body)
    if not isinstance(raw, dict) or raw.get("format") != FORMAT:
        raise ValueError("not a record of a rank joining")
    if raw.get("version") != VERSION or raw.get("rank") != rank:
        raise ValueError("another version, or another rank's")
    world, local = raw.get("world_size"), raw.get("local_world_size")
    if not isinstance(world, int) or not 0 < world <= MAX_WORLD:
        raise ValueError("no world size")
    from nccl_doctor.model import Joining  # (a rank writes: no model)

    return Joining(
        rank=rank, world_size=world,
        local_world_size=local if isinstance(local, int) and local > 0 else None,
        host=str(raw.get("host", ""))[:MAX_HOST], pid=_int(raw.get("pid")),
        time_ns=_int(raw.get("time_ns")), address=str(raw.get("address", ""))[:MAX_ADDRESS],
        backend=str(raw.get("backend", ""))[:64], attempt=read_attempt(raw.get("attempt")))


def _int(value: Any) -> int:
    return value if isinstance(value, int) else 0
