"""Ranks that raised before they joined a process group (``<stem>.early_exit``,
names.EARLY_EXIT_SUFFIX).

A rank's capture is made when ``init_process_group`` returns: a rank that an uncaught exception
ends before that (a KeyError on a missing setting, a bad import, a wrong path) would leave
nothing, and the report would not know the job's ranks ever ran. The rank's excepthook
(rank/early_exit.py) leaves this small JSON file instead, named like a capture
(``rankNNNNN.HOST.PID``); the rank and world size come from the launcher's environment:

    {"format": "nccl-doctor early exit", "version": 1, "rank": 1, "world_size": 2,
     "host": "node1", "pid": 4242, "time_ns": 1700000000000000000,
     "type": "KeyError", "message": "'lr'",
     "path": "/work/train.py", "line": 12, "function": "main",
     "in_init": false,
     "traceback": [{"path": "/work/train.py", "line": 12, "function": "main"}, ...]}

``path``/``line``/``function``: the innermost frame of the traceback in the user's code (absent
when none is); ``in_init``: it was raised inside ``init_process_group`` (the rank reached the
rendezvous and a peer never came); ``traceback``: its innermost frames, innermost first, at most
MAX_FRAMES. Written whole (a temporary file renamed) and bounded (MAX_BYTES); a file that is
not one, or is damaged, is a note for the report, never the end of a replay.
"""

from __future__ import annotations

import json
import os
import re
import stat
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterator, Mapping

from nccl_doctor import bounded_json
from nccl_doctor.capture.names import EARLY_EXIT_SUFFIX
from nccl_doctor.capture.unrecorded import MAX_HOST, MAX_WORLD
from nccl_doctor.env import attempt_of
from nccl_doctor.files import read_regular

if TYPE_CHECKING:
    from nccl_doctor.location import Location
    from nccl_doctor.model import EarlyExit

__all__ = ["FORMAT", "MAX_BYTES", "MAX_FRAMES", "read_early_exits", "write_early_exit"]

FORMAT = "nccl-doctor early exit"
VERSION = 1
MAX_BYTES = 16 * 1024  # what the writer leaves is a few KiB at most: a bigger file is not ours
MAX_FRAMES = 8  # innermost frames of the traceback kept
MAX_MESSAGE = 500  # characters of the exception's message kept (as rank/hooks.py notes one)
MAX_NAME = 200  # characters of an exception type or a function name kept
MAX_PATH = 1000  # characters of a source path kept
_NAME = re.compile(r"rank(\d{5,7})\.[^/]*" + re.escape(EARLY_EXIT_SUFFIX))


def stem(rank: int, host: str, pid: int) -> str:
    """The name a rank's files start with (its capture's, rank/recorder/core.py)."""
    return f"rank{rank:05d}.{re.sub(r'[^A-Za-z0-9_-]', '_', host)[:64]}.{pid}"


def write_early_exit(directory: Path, rank: int, world_size: int, host: str,
                     raised: Mapping[str, Any]) -> Path | None:
    """Leave the record of a rank that raised before joining; None when it cannot be made.
    ``raised``: ``rank.hooks.exception_fields`` of the exception, with ``in_init``,
    ``traceback`` (frames as dicts, innermost first) and ``time_ns``. Never raises."""
    try:
        doc = _bounded({
            "format": FORMAT, "version": VERSION, "rank": rank, "world_size": world_size,
            "host": host[:MAX_HOST], "pid": os.getpid(), "attempt": list(attempt_of(os.environ)),
            **raised,
        })
        body = _fit(doc)
        path = directory / f"{stem(rank, host, os.getpid())}{EARLY_EXIT_SUFFIX}"
        tmp = path.with_name(f".{path.name}.tmp")
        directory.mkdir(parents=True, exist_ok=True)
        try:
            tmp.write_bytes(body)
            os.replace(tmp, path)
        except OSError:
            tmp.unlink(missing_ok=True)  # (a full disk: no half file left behind)
            return None
        return path
    except Exception:  # noqa: BLE001 - the rank is ending: never a second traceback
        return None


def _bounded(doc: dict[str, Any]) -> dict[str, Any]:
    doc["type"] = str(doc.get("type", ""))[:MAX_NAME]
    doc["message"] = str(doc.get("message", ""))[:MAX_MESSAGE]
    if "path" in doc:
        doc["path"] = str(doc["path"])[:MAX_PATH]
        doc["function"] = str(doc.get("function", ""))[:MAX_NAME]
    doc["traceback"] = [{"path": str(f.get("path", ""))[:MAX_PATH], "line": f.get("line"),
                         "function": str(f.get("function", ""))[:MAX_NAME]}
                        for f in list(doc.get("traceback") or ())[:MAX_FRAMES]]
    return doc


def _fit(doc: dict[str, Any]) -> bytes:
    """``doc`` as JSON within MAX_BYTES: escaped non-ASCII text can swell it, and then the
    traceback goes first, then most of the message."""
    body = json.dumps(doc, sort_keys=True).encode()
    if len(body) > MAX_BYTES:
        doc["traceback"] = []
        body = json.dumps(doc, sort_keys=True).encode()
    if len(body) > MAX_BYTES:
        doc["message"] = doc["message"][:80]
        if "path" in doc:
            doc["path"] = doc["path"][:200]
        body = json.dumps(doc, sort_keys=True).encode()
    return body


def read_early_exits(directory: Path, attempt: tuple[int, int] | None = None
                     ) -> tuple[dict[int, tuple[EarlyExit, int]], list[str]]:
    """(rank -> (how it ended, its world size or 0), notes) for the records in ``directory``
    (of launch ``attempt`` only, when one is given). A file of that suffix that is not a record
    (not a regular file, not named for a rank, too large) or cannot be read is a note, never a
    rank's end: a damaged file says nothing of the job. A rank with several records (a
    launcher's restarts) is told by its latest."""
    found: dict[int, tuple[EarlyExit, int]] = {}
    notes: list[str] = []
    times: dict[int, int] = {}
    for rank, ended, world in _records(directory, notes):
        if attempt is not None and ended.attempt != attempt:
            continue
        times[rank] = times.get(rank, 0) + 1
        held = found.get(rank)
        if held is None or (ended.time_ns or 0) >= (held[0].time_ns or 0):
            found[rank] = ended, world
    for rank, n in sorted(times.items()):
        if n > 1:
            notes.append(f"rank {rank} raised before joining a process group {n} times (a "
                         "launcher's restarts?): its latest is reported")
    return found, notes


def attempts_in(directory: Path) -> dict[tuple[int, int], int | None]:
    """The launch attempts whose ranks left a record here, each with its earliest time."""
    out: dict[tuple[int, int], int | None] = {}
    for _, ended, _ in _records(directory, []):
        out[ended.attempt] = earliest(out.get(ended.attempt), ended.time_ns)
    return out


def earliest(a: int | None, b: int | None) -> int | None:
    """The earlier of two times, either unknown (None)."""
    return b if a is None else a if b is None else min(a, b)


def _records(directory: Path, notes: list[str]) -> Iterator[tuple[int, EarlyExit, int]]:
    """(rank, how it ended, its world size or 0) of each record in ``directory``; what is not
    one is said in ``notes``."""
    for path in sorted(directory.glob(f"*{EARLY_EXIT_SUFFIX}")):
        named = _NAME.fullmatch(path.name)
        try:
            st = path.lstat()  # never open a FIFO: it would block
        except OSError:
            continue  # gone meanwhile
        if named is None or not stat.S_ISREG(st.st_mode) or int(named.group(1)) >= MAX_WORLD:
            notes.append(f"{path.name} skipped: not an nccl-doctor record of a rank that raised "
                         "before joining a process group")
            continue
        rank = int(named.group(1))
        if st.st_size > MAX_BYTES:
            notes.append(f"{path.name} skipped: {st.st_size:,} bytes, more than a record of a "
                         f"rank that raised before joining holds ({MAX_BYTES // 1024} KiB)")
            continue
        try:
            ended, world = _parse(read_regular(path, MAX_BYTES + 1), rank)
        except (OSError, ValueError) as err:
            notes.append(f"rank {rank}'s record of an exception before joining a process group "
                         f"({path.name}) is damaged ({err}): skipped, what it said is unknown")
            continue
        yield rank, ended, world


def _parse(raw: bytes, rank: int) -> tuple[EarlyExit, int]:
    doc = bounded_json.loads(raw, limit=MAX_BYTES)
    if not isinstance(doc, dict) or doc.get("format") != FORMAT:
        raise ValueError("not an early-exit record")
    if doc.get("rank") != rank:
        raise ValueError(f"it names rank {doc.get('rank')!r}, its file name rank {rank}")
    tp = doc.get("type")
    if not isinstance(tp, str) or not tp:
        raise ValueError("no exception type")
    message = str(doc.get("message") or "")[:MAX_MESSAGE]
    world = doc.get("world_size")
    if not _count(world) or not rank < world <= MAX_WORLD:
        world = 0
    frames = doc.get("traceback")
    traceback = tuple(f for f in (_location(x) for x in (
        frames[:MAX_FRAMES] if isinstance(frames, list) else ())) if f is not None)
    from nccl_doctor.model import EarlyExit  # (a rank writes: no model)

    return EarlyExit(
        exception=f"{tp[:MAX_NAME]}: {message}" if message else tp[:MAX_NAME],
        callsite=_location(doc), host=str(doc.get("host") or "")[:MAX_HOST],
        pid=doc["pid"] if _count(doc.get("pid")) else 0,
        time_ns=doc["time_ns"] if _count(doc.get("time_ns")) else None,
        in_init=doc.get("in_init") is True, traceback=traceback,
        attempt=read_attempt(doc.get("attempt")),
    ), world


def _location(raw: Any) -> Location | None:
    if not isinstance(raw, dict):
        return None
    path, line, function = raw.get("path"), raw.get("line"), raw.get("function", "")
    if not isinstance(path, str) or not path or not _count(line):
        return None
    from nccl_doctor.location import Location

    return Location(path[:MAX_PATH], line, str(function)[:MAX_NAME])


def read_attempt(raw: Any) -> tuple[int, int]:
    """A marker's launch attempt as written (``[requeues, restarts]``); (0, 0) for anything
    else, as a marker written before attempts were recorded."""
    if (isinstance(raw, list) and len(raw) == 2
            and all(isinstance(n, int) and not isinstance(n, bool) and 0 <= n < 1 << 20
                    for n in raw)):
        return raw[0], raw[1]
    return 0, 0


def _count(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0
