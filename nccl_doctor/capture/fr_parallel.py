"""Many Flight Recorder dumps read on every core: at 1,024 ranks the restricted unpickling of
~400 MB of dumps is most of a replay's time, and it parallelises by file.

Each worker (a forked process) reads its share of the files, sends back per rank and group the
sequence numbers and compared keys of the collectives (integers: cheap to send), receives the
window every rank must keep (nccl_doctor/capture/fr_window.py), and sends back only those
entries. Its errors come back as the same one-line errors a serial read raises.
"""

from __future__ import annotations

import gc
import multiprocessing
import os
from array import array
from pathlib import Path
from typing import Any

from nccl_doctor.capture import fr_dump, fr_window
from nccl_doctor.errors import DoctorError

#: Below this many files one process reads them (a fork costs more than it saves).
MIN_FILES = 64


class _Sent:
    """A column as sent back: ``seqs`` and ``keys`` (global key ids once remapped)."""

    __slots__ = ("seqs", "keys")

    def __init__(self, seqs: array, keys: array) -> None:
        self.seqs, self.keys = seqs, keys


def _work(conn: Any, files: list[Path]) -> None:
    try:
        gc.disable()  # plain acyclic data, millions of objects (see fr_dump.load_dumps)
        by_rank: dict[int, dict[str, Any]] = {}
        problems: list[str] = []
        notes: list[str] = []
        errors: list[DoctorError] = []
        fr_dump._read_all(files, by_rank, problems, notes, errors)
        ids: dict[tuple, int] = {}
        cols = {r: fr_window.columns(d.get("entries") or [], ids) for r, d in by_rank.items()}
        sent = {r: {g: (array("q", c.seqs), array("q", c.keys)) for g, c in rc.items()}
                for r, rc in cols.items()}
        totals = {r: len(d.get("entries") or []) for r, d in by_rank.items()}
        conn.send(("columns", sent, list(ids), totals, problems, notes, errors))
        start_of = conn.recv()
        conn.send(("dumps", {r: fr_window.cut(d, cols[r], start_of) for r, d in by_rank.items()}))
    except DoctorError as err:
        conn.send(("error", err))
    except Exception as err:  # a bug here must not hang the parent: it reads serially instead
        conn.send(("failed", repr(err)))
    finally:
        conn.close()
        # at once: tearing down millions of objects nobody needs would cost seconds
        os._exit(0)


def load_window(path: Path, workers: int | None = None) -> fr_dump.Dumps:
    """``fr_dump.load_dumps(path)`` with each rank's entries cut to the window the analysis
    needs, read by ``workers`` processes (default: the cores, at most 8) when there are many
    files; one process otherwise, or when a worker fails."""
    files = fr_dump.candidates(path) if path.exists() else []
    cores = min(os.cpu_count() or 1, 8) if workers is None else workers
    if len(files) < MIN_FILES or cores < 2:
        return _serial(path)
    try:
        return _parallel(path, files, cores)
    except _Fallback:
        return _serial(path)


class _Fallback(Exception):
    pass


def _serial(path: Path) -> fr_dump.Dumps:
    dumps = fr_dump.load_dumps(path)
    collecting = gc.isenabled()
    gc.disable()
    try:
        by_rank, kept, total = fr_window.trim(dumps.by_rank)
    finally:
        if collecting:
            gc.enable()
    return fr_dump.Dumps(by_rank, dumps.problems, dumps.notes, compared=total, kept=kept,
                         damaged=dumps.damaged)


def _parallel(path: Path, files: list[Path], cores: int) -> fr_dump.Dumps:
    ctx = multiprocessing.get_context("fork")
    shares = [files[i::cores] for i in range(cores)]
    procs, conns = [], []
    for share in shares:
        mine, theirs = ctx.Pipe()
        proc = ctx.Process(target=_work, args=(theirs, share), daemon=True)
        proc.start()
        theirs.close()
        procs.append(proc)
        conns.append(mine)
    try:
        replies = [_receive(c) for c in conns]
        table: dict[tuple, int] = {}
        columns: dict[int, dict[str, _Sent]] = {}
        problems, notes, errors, compared = [], [], [], 0
        for _, sent, keys, totals, probs, nts, errs in replies:
            remap = array("q", (table.setdefault(k, len(table)) for k in keys))
            for rank, groups in sent.items():
                if rank in columns:
                    problems.append(f"a second dump of rank {rank} skipped")
                    continue
                columns[rank] = {g: _Sent(seqs, array("q", (remap[k] for k in keys_)))
                                 for g, (seqs, keys_) in groups.items()}
                compared += totals[rank]
            problems += probs
            notes += [n for n in nts if n not in notes]
            errors += errs
        start_of = fr_window.starts(columns)
        for conn in conns:
            conn.send(start_of)
        by_rank: dict[int, dict[str, Any]] = {}
        for conn in conns:
            for rank, dump in _receive(conn)[1].items():
                by_rank.setdefault(rank, dump)
    finally:
        for conn in conns:
            conn.close()
        for proc in procs:
            proc.join(5)
            if proc.is_alive():
                proc.kill()
                proc.join()
    if not by_rank:
        if len(errors) == 1:
            raise errors[0]
        raise fr_dump.CorruptCapture(f"none of the {len(files)} files in {path} is a readable "
                                     f"Flight Recorder dump ({problems[0] if problems else '?'})")
    kept = sum(len(d["entries"]) for d in by_rank.values())
    return fr_dump.Dumps(by_rank, tuple(problems), tuple(notes), compared=compared, kept=kept)


def _receive(conn: Any) -> tuple:
    try:
        reply = conn.recv()
    except (EOFError, OSError):
        raise _Fallback() from None
    if reply[0] == "error":
        raise reply[1]
    if reply[0] == "failed":
        raise _Fallback()
    return reply
