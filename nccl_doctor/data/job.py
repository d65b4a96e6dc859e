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
from functools import cached_property, partial
from pathlib import Path
from typing import TYPE_CHECKING, Iterator

from nccl_doctor.capture import metrics_log, watch_record
from nccl_doctor.capture.capture_set import CaptureSet, Read, ahead
from nccl_doctor.data import columns
from nccl_doctor.diagnosis import Diagnosis
from nccl_doctor.errors import CaptureNotFound, DoctorError
from nccl_doctor.model import EventSource, TraceSet

if TYPE_CHECKING:  # (imported where a table is made: ``export`` writes Parquet without pandas)
    import pandas as pd
    import pyarrow as pa

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
        """One line, reading no capture: ``<Job 4 ranks, /runs/run-1>`` (the ranks its
        manifests say; none for a lone capture file or Flight Recorder dumps)."""
        world = 0
        for directory in self._captures.directories:
            try:
                manifest = self._captures.manifest(directory)
            except DoctorError:
                continue
            world = max(world, manifest.world_size or 0) if manifest is not None else world
        where = ", ".join(map(str, self.paths))
        where = where if len(where) <= 100 else "..." + where[-97:]
        return f"<Job {f'{world} ranks, ' if world else ''}{where}>"

    def _repr_html_(self) -> str:
        """What a notebook shows for the job: its diagnosis, as ``replay``'s report.html
        draws it, timeline included (reporters/html.py ``fragment``) - diagnosed when
        displayed, each time (``diagnose()``: the captures read once, kept)."""
        from nccl_doctor.analysis.page_builder import page
        from nccl_doctor.reporters.html import fragment

        diagnosis = self.diagnose()
        return fragment(diagnosis, page(self.traces, diagnosis))

    # -- what replay reads -------------------------------------------------------------------
    @cached_property
    def traces(self) -> TraceSet:
        """The job as ``nccl-doctor replay`` loads it (the typed model of nccl_doctor.model)."""
        from nccl_doctor.analysis.calls.loaded import loaded
        return loaded(self._captures)

    def diagnose(self, log: PathLike | None = None) -> Diagnosis:
        """The diagnosis ``nccl-doctor replay`` gives (``log``: as its ``--log``)."""
        from nccl_doctor.analysis import analyze
        from nccl_doctor.analysis.attempts import with_attempts
        traces = self.traces
        if log is not None:
            if not Path(log).is_file():
                raise CaptureNotFound(f"log {log} does not exist or is not a file")
            traces = replace(traces, metrics_log=tuple(metrics_log.parse_file(Path(log))))
        return with_attempts(analyze(traces), self._captures, analyze)

    # -- tables --------------------------------------------------------------------------------
    @cached_property
    def calls(self) -> pd.DataFrame:
        """One row per recorded collective or point-to-point call, every rank, sorted by rank
        and record number (columns: ``nccl_doctor.data.columns.COLUMNS``)."""
        cats = columns.categories()
        table = columns.Table(cats, expect=len(self._captures.chosen()))
        for part in self._call_parts(cats, hold=True):
            table.add(part)
        return table.frame()

    def iter_calls(self, ranks_per_chunk: int = 64) -> Chunks:
        """``calls`` in pieces of ``ranks_per_chunk`` ranks, for a table too large to hold twice
        (``nccl-doctor export``): the same rows and columns, in the same order - pandas
        DataFrames when iterated, Arrow tables from its ``arrow()``."""
        return Chunks(self, ranks_per_chunk)

    def _chunks(self, ranks_per_chunk: int, whole: bool) -> Iterator[columns.Table]:
        cats = columns.categories()
        table = columns.Table(cats, expect=ranks_per_chunk, whole=whole)
        parts = 0
        for part in self._call_parts(cats, hold=False):
            table.add(part)
            parts += 1
            if parts >= ranks_per_chunk:
                yield table
                table, parts = columns.Table(cats, expect=ranks_per_chunk, whole=whole), 0
        if parts:
            yield table

    @cached_property
    def ranks(self) -> pd.DataFrame:
        """One row per rank: where it ran, how it ended (as the report says), its capture."""
        import pandas as pd

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
        import pandas as pd

        rows = [{"group": name, "ranks": tuple(g.ranks), "size": len(g.ranks),
                 "backend": g.backend, "desc": g.desc}
                for name, g in sorted(self.traces.groups.items())]
        return pd.DataFrame(rows, columns=["group", "ranks", "size", "backend", "desc"])

    @cached_property
    def notes(self) -> pd.DataFrame:
        """Every note the ranks recorded (process groups, RNG seeding, generations' hashes,
        metrics, ...): rank, note, time, and the rest of the note as a dict."""
        import pandas as pd

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
        import pandas as pd

        from nccl_doctor.analysis.slow.lateness import lateness_table

        rows = [row.to_json() for row in lateness_table(self.traces)]
        return pd.DataFrame(rows, columns=list(_LATENESS_COLUMNS))

    @property
    def problems(self) -> tuple[str, ...]:
        """What could not be read, or only in part (as replay's notes say)."""
        return self.traces.problems

    # -- reading -------------------------------------------------------------------------------
    def _call_parts(self, cats: dict[str, columns.Categories], hold: bool,
                    ) -> Iterator[columns.Columns | columns.Raw]:
        """Each launch attempt's calls, the first first (one attempt for a job its launcher
        never restarted): the earlier ones' read from their own captures, then the last's."""
        attempts = list(self._captures.attempts())
        for number, key in enumerate(attempts[:-1], 1):
            earlier = CaptureSet(*self.paths, attempt=key, evidence=False, job_ended=True,
                                 replay=False)
            yield from self._attempt_parts(earlier, cats, False, number, flight=False)
        yield from self._attempt_parts(self._captures, cats, hold, max(1, len(attempts)),
                                       last=True)

    def _attempt_parts(self, captures_set: CaptureSet, cats: dict[str, columns.Categories],
                       hold: bool, number: int, flight: bool = True, last: bool = False,
                       ) -> Iterator[columns.Columns | columns.Raw]:
        """One attempt's ranks' columns, in rank order: from its capture read as columns (as
        the set holds it, else read here - ``hold``: then held by the set, while the job is
        small), or from its events where only Flight Recorder saw the job (dumps, or calls
        merged from ``fr``: the last attempt's, ``flight``). The calls a rank never returned
        from waited until its exit, else the job's stop or end (``last`` attempt's: an
        earlier one's ranks ended when its launcher restarted them, unrecorded), else its
        last record (columns.rank_end)."""
        captures = captures_set.capture_dirs
        scans = captures_set.chosen()
        # (a capture file opened alone still ends with its run: its directory's)
        ends = {d: job_end(captures_set, d) for d in {p.parent for p in scans.values()}
                if not captures_set.is_dumps(d)} if last else {}
        # Flight Recorder's view (dumps given, or the pulls the watchdog kept): replay's
        # merge says which calls it saw alone, and which returned calls are still in flight
        pulled = any((d / watch_record.FR_DIR).is_dir() for d in captures if d.is_dir())
        merged = self.traces if flight and (
            self.fr is not None or pulled
            or len(captures) < len(captures_set.directories)) else None
        fr_only, flying = {}, {}
        if merged is not None:
            for rank, t in merged.ranks.items():
                if rank not in scans or any(e.source is EventSource.FLIGHT_RECORDER
                                            for e in t.events):
                    fr_only[rank] = t
                flying[rank] = {e.idx for e in t.events
                                if e.in_flight and e.source is not EventSource.FLIGHT_RECORDER}
        order = sorted({*scans, *fr_only})
        read = ahead(partial(_raw, captures_set, ends), [scans[r] for r in order if r in scans])
        for rank in order:
            raw = None
            if rank in scans:
                made, raw = next(read)
                if hold:
                    captures_set.hold(scans[rank], made)
                if raw is not None and number != 1:
                    raw = replace(raw, attempt=number)
                if raw is not None and flying.get(rank):  # (Flight Recorder's view merged)
                    yield columns.in_flight(columns.coded(raw, cats), flying[rank], cats,
                                            raw.end_ns)
                elif raw is not None:
                    yield raw
            if rank in fr_only:
                trace = fr_only[rank]
                if rank in scans:  # only what Flight Recorder added
                    trace = replace(trace, events=tuple(
                        e for e in trace.events if e.source is EventSource.FLIGHT_RECORDER))
                yield columns.trace_columns(trace, cats, number,
                                            end_ns=raw.end_ns if raw is not None else None)


_RANK_COLUMNS = ("rank", "host", "pid", "local_rank", "node_rank", "world_size", "started",
                 "exit", "exit_detail", "exit_code", "signal", "exception", "records",
                 "integrity", "damaged", "actor_class", "actor_id", "capture")


class Chunks:
    """``Job.iter_calls``: the calls table a few ranks at a time, made as it is read - pandas
    DataFrames when iterated, or Arrow tables (``arrow``: what ``export`` writes to Parquet,
    without pandas)."""

    def __init__(self, job: Job, ranks_per_chunk: int) -> None:
        self._job, self._per_chunk = job, ranks_per_chunk
        self._frames: Iterator[columns.Table] | None = None
        self._used = False

    def __iter__(self) -> Chunks:
        return self

    def __next__(self) -> pd.DataFrame:
        if self._frames is None:
            self._start()
            self._frames = self._job._chunks(self._per_chunk, whole=True)
        return next(self._frames).frame()

    def arrow(self) -> Iterator[pa.Table]:
        """The chunks as Arrow tables (instead of frames: one or the other), each rank's
        calls a chunk of each column, as read (no copy)."""
        self._start()
        return (table.arrow() for table in self._job._chunks(self._per_chunk, whole=False))

    def _start(self) -> None:
        if self._used:
            raise RuntimeError("these chunks were read already")
        self._used = True


def _raw(captures: CaptureSet, ends: dict[Path, tuple[int, ...]], path: Path,
         ) -> tuple[Read | DoctorError, columns.Raw | None]:
    """One capture (as the set holds it, else read here: a reading thread) and its calls
    (``columns.raw_calls``, up to its directory's job end ``ends``; None: it cannot be
    read)."""
    made = captures.fresh(path)
    return made, None if isinstance(made, DoctorError) else columns.raw_calls(
        made, ends.get(path.parent, ()))


def job_end(captures: CaptureSet, directory: Path) -> tuple[int, ...]:
    """When the job of capture ``directory`` was stopped (the watchdog's stop: nccl-doctor's,
    for a hang, or the user's interrupt) and when it ended (its manifest), ns - what is
    known: a rank that records no exit of its own waited in its last call until then
    (columns.rank_end)."""
    try:
        manifest = captures.manifest(directory)
    except DoctorError:
        manifest = None
    watch = captures.evidence(directory).watch
    times = (watch.stopped_at if watch is not None else None,
             manifest.ended_at if manifest is not None else None)
    return tuple(round(t * 1e9) for t in times if t is not None)


_LATENESS_COLUMNS = ("rank", "host", "calls", "last", "per_call_s", "per_step_s",
                     "cost_per_step_s", "cost_s", "cost_share", "step_s", "steps")
