"""The names of a capture directory's files, and which of them are nccl-doctor's own (an --out
holding only these is an earlier run's, to be replaced with --force).

Each file has one writer: the recorder writes ``rank*.ndcap`` / ``.fault`` / ``.unrecorded``,
and ``rank*.early_exit`` when a rank raises before it joins a process group
(capture/early_exit.py);
the supervisor writes ``.nccl-doctor.lock`` while it runs (capture/claim.py), ``manifest.json``
(capture/manifest.py), the watchdog's record
(capture/watch_record.py), ``gpu.jsonl`` (gpu/series.py), ``stragglers.jsonl``
(stacks/samples.py) and ``report.json``; the CLI writes ``report.html``.
"""

from __future__ import annotations

import os
import re
import stat
import time
from pathlib import Path
from typing import Callable

from nccl_doctor.capture import format as fmt
from nccl_doctor.capture.format import MAX_WORLD

# (the names of the files other modules write are spelled here, and those modules import them:
# a rank reads this module, and importing the GPU series, the stack samples and the manifest
# with it cost every process of the job their import)
#: held by the supervisor while it runs (capture/claim.py)
LOCK = ".nccl-doctor.lock"
#: the run's manifest (capture/manifest.py)
MANIFEST = "manifest.json"
#: the GPU readings (gpu/series.py)
GPU_JSONL = "gpu.jsonl"
#: the stacks sampled from stragglers (stacks/samples.py)
STRAGGLERS_JSONL = "stragglers.jsonl"

#: Left by a rank that an uncaught exception ended before it joined a process group (no
#: capture exists then): capture/early_exit.py writes and reads it.
EARLY_EXIT_SUFFIX = ".early_exit"
#: Left by a rank as it begins init_process_group, before its capture can exist (the watchdog
#: sees the ranks waiting in the rendezvous): capture/joining.py writes and reads it.
JOINING_SUFFIX = ".joining"
REPORT_JSON = "report.json"
#: The watchdog's record, the stacks it pulled and the Flight Recorder dumps it asked for, one
#: file a rank (capture/watch_record.py writes and reads them)
WATCH_JSON = "watchdog.json"
STACKS_JSON = "stacks.json"
FR_DIR = "flight_recorder"
REPORT_HTML = "report.html"  # the same diagnosis as a page (nccl_doctor/reporters/html.py)
#: Every name nccl-doctor writes into a capture directory (an --out holding only these is ours).
OWN_FILES = (f"*{fmt.CAPTURE_SUFFIX}", f"*{fmt.FAULT_SUFFIX}", f"*{fmt.UNRECORDED_SUFFIX}",
             f"*{EARLY_EXIT_SUFFIX}", f"*{JOINING_SUFFIX}", MANIFEST, REPORT_JSON, REPORT_HTML, GPU_JSONL,
             STRAGGLERS_JSONL, WATCH_JSON, STACKS_JSON,
             f"{FR_DIR}/rank_*.json", LOCK)


def remove_own_files(directory: Path) -> None:
    """Delete what an earlier run wrote into ``directory`` (never any other file)."""
    for pattern in OWN_FILES:
        for path in directory.glob(pattern):
            if path.is_symlink() or not path.is_dir():  # a directory of that name is not ours
                path.unlink()
    folder = directory / FR_DIR
    if folder.is_dir() and not any(folder.iterdir()):
        folder.rmdir()


#: A capture's name as the recorder makes it: rank (5 digits or more), host (sanitised), pid.
_CAPTURE_NAME = re.compile(r"^rank(\d{5,})\.([A-Za-z0-9_-]*)\.(\d+)\b")


def named_rank(path: Path) -> tuple[int, str] | None:
    """(rank, host) a capture file's name gives (None for a name the recorder does not make):
    whose capture it was, when the file itself cannot be read."""
    m = _CAPTURE_NAME.match(path.name)
    return (int(m.group(1)), m.group(2)) if m and int(m.group(1)) < MAX_WORLD else None


def node_dir(out: Path, host: str) -> Path:
    """The capture directory of another host's ranks in a Ray job whose driver's run writes
    ``out`` (``nccl-doctor run --ray``): ``out``'s sibling named after the host, on that host's
    own disk, where Ray's workers there write and that host's node doctor reads."""
    return out.parent / f"{out.name}.{re.sub(r'[^A-Za-z0-9_-]', '_', host)[:64]}"


def capture_files(directory: Path) -> list[Path]:
    """The capture files in ``directory``: regular files named ``*.ndcap`` (never a FIFO, a
    device or a directory of that name, which ``odd_captures`` names)."""
    return sorted(p for p in directory.glob(f"*{fmt.CAPTURE_SUFFIX}") if _regular(p))


def odd_captures(directory: Path) -> list[str]:
    """A note for each entry named like a capture that is not a regular file (skipped: opening
    a FIFO would wait for a writer forever)."""
    return [f"{p.name} is not a capture file but a {_kind(p)}: skipped"
            for p in sorted(directory.glob(f"*{fmt.CAPTURE_SUFFIX}")) if not _regular(p)]


def _regular(path: Path) -> bool:
    try:
        return stat.S_ISREG(path.stat().st_mode)
    except OSError:  # gone, or a dangling link
        return False


def _kind(path: Path) -> str:
    try:
        mode = path.stat().st_mode
    except OSError:
        return "broken link"
    for test, name in ((stat.S_ISDIR, "directory"), (stat.S_ISFIFO, "FIFO"),
                       (stat.S_ISSOCK, "socket"), (stat.S_ISCHR, "character device"),
                       (stat.S_ISBLK, "block device")):
        if test(mode):
            return name
    return "special file"


def report_path(directory: Path) -> Path:
    return directory / REPORT_JSON


class FolderChanges:
    """Whether a folder may hold other entries than when last asked: its modification time
    moved (a file created, renamed or removed in it), or it is still within ``fresh`` seconds of
    that time (a filesystem whose times are coarse may give a change made in the same tick as
    the last listing the same time: while the time is that recent, the folder is listed again
    on each ask). One ``stat`` an ask: what lets a poll five times a second list the folder only
    when it changed - and, through a long wait, never."""

    def __init__(self, directory: Path, fresh: float = 2.0,
                 clock: Callable[[], float] = time.time) -> None:
        self.directory, self.fresh, self._clock = directory, fresh, clock
        self._seen: tuple[int, object] | None = None

    def moved(self, also: object = None) -> bool:
        """Whether to list it again. ``also``: anything else that calls for a listing when it
        changes."""
        try:
            mtime = os.stat(self.directory).st_mtime_ns
        except OSError:
            mtime = -1
        if self._seen == (mtime, also) and self._clock() - mtime / 1e9 >= self.fresh:
            return False
        self._seen = (mtime, also)
        return True
