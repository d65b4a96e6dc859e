"""``nccl_doctor.open(...)``: a recorded job as pandas tables, and the diagnosis replay gives.

The job's captures are one ``CaptureSet`` (capture/capture_set.py), read once whichever is
asked for first: ``Job.calls`` is built from the captures as columns (nccl_doctor/data/columns.py):
every record of every rank, no Python object per record. ``ranks``, ``groups``, ``notes`` and
``diagnose()`` come from the job as ``nccl-doctor replay`` loads it (analysis/calls/loaded.py), so
what they say is what replay says.
"""

from __future__ import annotations

import os
from dataclasses import replace
from collections import deque
from concurrent.futures import Future, ThreadPoolExecutor
from functools import cached_property
from pathlib import Path
from typing import Callable, Iterator

import pandas as pd

from nccl_doctor.capture import metrics_log, watch_record
from nccl_doctor.capture.capture_set import CaptureSet
from nccl_doctor.capture.follow import Scan
from nccl_doctor.data import columns
from nccl_doctor.diagnosis import Diagnosis
from nccl_doctor.errors import CaptureNotFound, DoctorError
from nccl_doctor.model import EventSource, TraceSet

PathLike = str | os.PathLike[str]


class Job:
    """A recorded job: a run's ``--out`` directory, every node's directories (or one directory
    holding them), one ``.ndcap`` capture, or a directory of Flight Recorder dumps. ``fr``: the
    job's own Flight Recorder dumps, merged as ``replay --fr`` merges them. Nothing is read
    until a table or the diagnosis is asked for; each is read once."""

    def __init__(self, *paths: PathLike, fr: PathLike | None = None) -> None:
        if not paths:
            raise TypeError("nccl_doctor.open() needs at least one path")
        self.paths = tuple(Path(p) for p in paths)
        self.fr = Path(fr) if fr is not None else None
        for p in (*self.paths, *((self.fr,) if self.fr else ())):
            if not p.exists():
                raise CaptureNotFound(f"{p} does not exist: pass the --out directory of an "
                                      "`nccl-doctor run`, a capture file or Flight Recorder dumps")
        # the job's captures, read once: each capture's columns held, shared by the tables and
        # the traces
        self._captures = CaptureSet(*self.paths, fr=self.fr, hold_columns=True)

    def __repr__(self) -> str:
        where = ", ".join(map(str, self.paths))
        return f"<nccl_doctor.Job {where}>"

    # -- what replay reads -------------------------------------------------------------------
    @cached_property
    def traces(self) -> TraceSet:
        """The job as ``nccl-doctor replay`` loads it (the typed model of nccl_doctor.model)."""
        from nccl_doctor.analysis.calls.loaded import loaded
        return loaded(self._captures)

    def diagnose(self, log: PathLike | None = None) -> Diagnosis:
        """The diagnosis ``nccl-doctor replay`` gives (``log``: as its ``--log``)."""
        from nccl_doctor.analysis import analyze
        traces = self.traces
        if log is not None:
            if not Path(log).is_file():
                raise CaptureNotFound(f"log {log} does not exist or is not a file")
            traces = replace(traces, metrics_log=tuple(metrics_log.parse_file(Path(log))))
        return analyze(traces)

    # -- tables --------------------------------------------------------------------------------
    @cached_property
    def calls(self) -> pd.DataFrame:
        """One row per recorded collective or point-to-point call, every rank, sorted by rank
        and record number (columns: ``nccl_doctor.data.columns.COLUMNS``)."""
        cats = columns.categories()
        return columns.frame(list(self._call_parts(cats, self._captures.scan)), cats)

    def iter_calls(self, ranks_per_chunk: int = 64) -> Iterator[pd.DataFrame]:
        """``calls`` in pieces of ``ranks_per_chunk`` ranks, for a table too large to hold twice
        (``nccl-doctor export``): the same rows and columns, in the same order."""
        cats = columns.categories()
        chunk: list[columns.Columns] = []
        for part in self._call_parts(cats, self._captures.held_scan):
            chunk.append(part)
            if len(chunk) >= ranks_per_chunk:
                yield columns.frame(chunk, cats)
                chunk = []
        if chunk:
            yield columns.frame(chunk, cats)

    @cached_property
    def ranks(self) -> pd.DataFrame:
        """One row per rank: where it ran, how it ended (as the report says), its capture."""
        from nccl_doctor.analysis.calls.ends import with_finished_marked
        traces = with_finished_marked(self.traces)
        rows = []
        for rank, t in sorted(traces.ranks.items()):
            m, ex = t.meta, t.exit
            rows.append({
                "rank": rank, "host": m.host, "pid": m.pid, "local_rank": m.local_rank,
                "node_rank": m.node_rank, "world_size": m.world_size,
                "started": pd.Timestamp(m.started_ns, unit="ns", tz="UTC")
                if m.started_ns else pd.NaT,  # (a rank only Flight Recorder saw: unknown)
                "exit": ex.kind.value, "exit_detail": ex.describe(), "exit_code": ex.code,
                "signal": ex.signal, "exception": ex.exception, "records": t.records,
                "integrity": t.integrity.describe(), "damaged": t.integrity.damaged,
                "actor_class": m.ray.get("actor_class"), "actor_id": m.ray.get("actor_id"),
                "capture": t.path,
            })
        for rank, u in sorted(traces.unrecorded.items()):
            rows.append({"rank": rank, "host": u.host, "exit": "unrecorded",
                         "exit_detail": u.why, "damaged": u.damaged})
        for rank, e in sorted(traces.early_exits.items()):  # raised before joining: no capture
            rows.append({"rank": rank, "host": e.host, "pid": e.pid, "exit": "exception",
                         "exit_detail": "raised before joining a process group",
                         "exception": e.exception, "damaged": False})
        return pd.DataFrame(rows, columns=list(_RANK_COLUMNS)).sort_values(
            "rank", kind="stable", ignore_index=True)

    @cached_property
    def groups(self) -> pd.DataFrame:
        """One row per process group: its name, global ranks, size, backend and description."""
        rows = [{"group": name, "ranks": tuple(g.ranks), "size": len(g.ranks),
                 "backend": g.backend, "desc": g.desc}
                for name, g in sorted(self.traces.groups.items())]
        return pd.DataFrame(rows, columns=["group", "ranks", "size", "backend", "desc"])

    @cached_property
    def notes(self) -> pd.DataFrame:
        """Every note the ranks recorded (process groups, RNG seeding, generations' hashes,
        metrics, ...): rank, note, time, and the rest of the note as a dict."""
        rows = []
        for rank, t in sorted(self.traces.ranks.items()):
            for n in t.notes:
                when = n.get("time_ns")
                rows.append({
                    "rank": rank, "note": str(n.get("note", "")),
                    "time": pd.Timestamp(when, unit="ns", tz="UTC")
                    if isinstance(when, int) else pd.NaT,
                    "data": {k: v for k, v in n.items() if k not in ("note", "time_ns")},
                })
        return pd.DataFrame(rows, columns=["rank", "note", "time", "data"])

    @cached_property
    def lateness(self) -> pd.DataFrame:
        """One row per rank that took part in a compared collective: how late it arrived
        (relative to the first member, per collective and per step), at how many it was the
        last, and its cost - how long its peers waited for it, in all, per step and as a share
        of the step's time. Across hosts it is measured without comparing clocks
        (analysis/slow/lateness.py; docs/stragglers.md)."""
        from nccl_doctor.analysis.slow.lateness import lateness_table

        rows = [row.to_json() for row in lateness_table(self.traces)]
        return pd.DataFrame(rows, columns=list(_LATENESS_COLUMNS))

    @property
    def problems(self) -> tuple[str, ...]:
        """What could not be read, or only in part (as replay's notes say)."""
        return self.traces.problems

    # -- reading -------------------------------------------------------------------------------
    def _call_parts(self, cats: dict[str, columns.Categories],
                    scan: Callable[[Path], Scan | DoctorError | None],
                    ) -> Iterator[columns.Columns]:
        """Each rank's columns, in rank order: from its capture read as columns (``scan``:
        held by the set, else read here), or from its events where only Flight Recorder saw
        the job (dumps, or calls merged from ``fr``)."""
        captures = self._captures.capture_dirs
        scans = self._captures.chosen()
        # Flight Recorder's view (dumps given, or the pulls the watchdog kept): replay's
        # merge says which calls it saw alone, and which returned calls are still in flight
        pulled = any((d / watch_record.FR_DIR).is_dir() for d in captures if d.is_dir())
        merged = self.traces if (self.fr is not None or pulled
                                 or len(captures) < len(self._captures.directories)) else None
        fr_only, flying = {}, {}
        if merged is not None:
            for rank, t in merged.ranks.items():
                if rank not in scans or any(e.source is EventSource.FLIGHT_RECORDER
                                            for e in t.events):
                    fr_only[rank] = t
                flying[rank] = {e.idx for e in t.events
                                if e.in_flight and e.source is not EventSource.FLIGHT_RECORDER}
        order = sorted({*scans, *fr_only})
        read = _read_ahead([scans[r] for r in order if r in scans], scan)
        for rank in order:
            if rank in scans:
                made = next(read)
                if made is not None:
                    yield columns.in_flight(columns.recoded(*made, cats), flying.get(rank, set()),
                                            cats)
            if rank in fr_only:
                trace = fr_only[rank]
                if rank in scans:  # only what Flight Recorder added
                    trace = replace(trace, events=tuple(
                        e for e in trace.events if e.source is EventSource.FLIGHT_RECORDER))
                yield columns.trace_columns(trace, cats)


_RANK_COLUMNS = ("rank", "host", "pid", "local_rank", "node_rank", "world_size", "started",
                 "exit", "exit_detail", "exit_code", "signal", "exception", "records",
                 "integrity", "damaged", "actor_class", "actor_id", "capture")


#: Captures read at once: each a worker's (numpy releases the GIL in the bulk of the work).
WORKERS = min(4, os.cpu_count() or 1)


Made = tuple[columns.Columns, dict[str, columns.Categories]] | None


def _columns(path: Path, scan: Callable[[Path], Scan | DoctorError | None]) -> Made:
    """One capture's calls, coded into interners of its own (``columns.recoded`` puts them into
    the table's): from ``scan(path)``, else read here (None: it cannot be read)."""
    made = scan(path)
    if made is None:
        return columns.capture_columns(path)
    if isinstance(made, DoctorError):
        return None
    own = columns.categories()
    return columns.scan_columns(made, own), own


def _read_ahead(paths: list[Path], scan: Callable[[Path], Scan | DoctorError | None],
                ) -> Iterator[Made]:
    """Each capture's columns (``_columns``), in order, read by ``WORKERS`` threads a few files
    ahead of the consumer: memory holds a few captures, never all (unless ``scan`` holds
    them)."""
    if WORKERS <= 1 or len(paths) <= 1:
        yield from (_columns(p, scan) for p in paths)
        return
    with ThreadPoolExecutor(WORKERS, thread_name_prefix="nccl-doctor-read") as pool:
        ahead: deque[Future] = deque()
        todo = iter(paths)
        for path in todo:
            ahead.append(pool.submit(_columns, path, scan))
            if len(ahead) >= 2 * WORKERS:
                break
        while ahead:
            done = ahead.popleft().result()
            nxt = next(todo, None)
            if nxt is not None:
                ahead.append(pool.submit(_columns, nxt, scan))
            yield done


_LATENESS_COLUMNS = ("rank", "host", "calls", "last", "per_call_s", "per_step_s",
                     "cost_per_step_s", "cost_s", "cost_share", "step_s", "steps")
