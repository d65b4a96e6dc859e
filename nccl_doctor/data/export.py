"""Writing a job's calls table to a file (``nccl-doctor export``): Parquet through pyarrow, or
CSV, the columns of ``Job.calls``.

The table is written a few ranks at a time (``Job.iter_calls``): a large job is never held
whole, let alone twice. The file is written beside its name and moved there once complete, so
an interrupted export leaves no half-written table under the name asked for.
"""

from __future__ import annotations

import os
import queue
import threading
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Iterable

from nccl_doctor.errors import UsageError

if TYPE_CHECKING:  # pyarrow, numpy and the columns at the write: the CLI's parser imports this
    import pandas as pd  # module for FORMATS, and `run` must not pay for them
    import pyarrow as pa

FORMATS = ("parquet", "csv")
# (data/columns.py's COLUMNS and TEXT: that module imports numpy and the reader, this one must
# not; a test holds them equal)
_COLUMNS = ("rank", "host", "pid", "attempt", "group", "seq", "torch_seq", "op", "kind", "input", "output",
            "nbytes", "peer", "group_size", "t_enter", "t_exit", "duration_s", "waited_s",
            "state", "in_flight", "async", "composite", "callsite", "function", "api_callsite",
            "issuing", "thread", "idx", "parent", "source")
_TEXT = ("host", "group", "op", "kind", "input", "output", "state", "callsite", "function",
         "api_callsite", "issuing", "source")
_SUFFIXES = {".parquet": "parquet", ".pq": "parquet", ".csv": "csv"}


def format_for(path: Path, fmt: str | None) -> str:
    """The format asked for, else the one ``path``'s suffix names. A suffix that names the
    other format is a ``UsageError`` (``--format csv -o calls.parquet`` would write CSV into a
    Parquet file's name)."""
    found = _SUFFIXES.get(path.suffix.lower())
    if fmt is not None and found is not None and found != fmt:
        ends = " or ".join(s for s, f in _SUFFIXES.items() if f == fmt)
        raise UsageError(f"-o {path}: its suffix names the {found} format, not --format {fmt}: "
                         f"end the file in {ends}, or leave --format out")
    if fmt is not None:
        return fmt
    if found is None:
        raise UsageError(f"-o {path}: its suffix names no format; end it in .parquet or .csv, "
                         "or pass --format parquet|csv")
    return found


def write(chunks: Iterable[pd.DataFrame] | Callable[[], Iterable[pd.DataFrame]], path: Path,
          fmt: str) -> int:
    """Write ``chunks`` (frames of the same columns; or what makes them afresh at each call,
    ``Job.iter_calls``) to ``path`` as ``fmt``; rows written. Raises OSError as the filesystem
    does, ImportError when Parquet lacks pyarrow."""
    part = path.with_name(f".{path.name}.part")
    try:
        if fmt != "parquet":
            rows = _csv(chunks() if callable(chunks) else chunks, part)
        elif not callable(chunks):
            rows = _parquet(chunks, part, required=False)
        else:
            try:
                rows = _parquet(chunks(), part, required=True)
            except _Nulls:  # a later chunk left a text empty the first did not: again
                rows = _parquet(chunks(), part, required=False)
        os.replace(part, path)
    finally:
        if part.exists():
            part.unlink()
    return rows


def keep_freed_memory() -> None:
    """Have glibc's allocator keep what this process frees for its next allocation, rather
    than hand it back to the system and fault fresh pages in again (each capture's columns, each
    chunk's, are freed and made again: 50,000 page faults, 0.3 s of system time for 10 million
    rows). For ``nccl-doctor export``'s own process, which ends with the export (the CLI calls
    it; a library call of ``write`` leaves its caller's allocator alone); with another C library
    nothing is done."""
    import ctypes

    try:
        libc = ctypes.CDLL(None)
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return
    for option in (_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD):
        mallopt(option, 256 << 20)


_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3  # (glibc's malloc.h)


def _csv(chunks: Iterable[pd.DataFrame], part: Path) -> int:
    from nccl_doctor.data.columns import COLUMNS

    rows, first = 0, True
    with part.open("w", newline="") as fh:
        for chunk in chunks:
            chunk.to_csv(fh, header=first, index=False)
            rows, first = rows + len(chunk), False
    if first:  # no call recorded: the header alone
        part.write_text(",".join(COLUMNS) + "\n")
    return rows


class _Nulls(Exception):
    """A chunk has an empty text in a column written as required."""


def _parquet(chunks: Iterable[pd.DataFrame], part: Path, required: bool) -> int:
    """The chunks as Parquet, written by a thread of their own while the next chunk is read
    (pyarrow encodes without the GIL: the file is written as fast as the slower of the two).
    Chunks that come as Arrow tables too (``Job.iter_calls``: ``arrow()``) are taken so,
    without pandas. ``required``: the columns the first chunk has no empty value in (a text, a
    time, a duration) are written as required too (a nullable column has a definition level
    encoded for each value: 0.5 s of 10 million rows' 2.5 s of encoding for the text columns); a
    later chunk with one there raises ``_Nulls``."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    arrow = getattr(chunks, "arrow", None)
    tables: Iterable[pa.Table] = arrow() if arrow is not None else (
        pa.Table.from_pandas(chunk, preserve_index=False) for chunk in chunks)
    schema: pa.Schema | None = None
    full: tuple[str, ...] = ()
    rows = 0
    with _Writer(part) as writer:
        for table in tables:
            if schema is None:
                full = tuple(name for name in table.column_names if required
                             and name not in _NEVER_NULL and table.column(name).null_count == 0)
                schema = _schema(table.schema, full)
            elif any(table.column(name).null_count for name in full):
                raise _Nulls
            writer.put(_as(table, schema))
            rows += table.num_rows
    if schema is None:  # no call recorded: an empty table of the same columns
        from nccl_doctor.data import columns

        empty = columns.Table(columns.categories()).arrow()
        pq.write_table(empty.cast(_schema(empty.schema)), part, **_OPTIONS)
    return rows


#: How the columns are encoded (the values read back are the same either way). Dictionaries
#: for the columns they shrink: a column of (nearly) all distinct values - the durations -
#: would have one tried and dropped in every row group (0.7 s of a 10 million row table's 4 s
#: of encoding). Times, sequence numbers and record numbers, which grow call by call, as
#: deltas (the file a third smaller, and faster written). Statistics (each row group's least
#: and greatest value, for a reader's filters to skip row groups) for the numbers that tell a
#: row group's rows apart - a row group holds some ranks' calls, in order: their rank, process,
#: attempt, times, sequence and record numbers, durations - not for those every row group spans
#: alike (sizes, peers, flags, threads: 15 ms a column of 10 million rows, skipping nothing);
#: those of the text columns cost another 0.8 s, and their row groups are rarely told apart by
#: them.
_DELTAS = ("t_enter", "t_exit", "seq", "torch_seq", "idx")
#: The columns that are never null (numbers held as integers and booleans: a call's time and
#: duration may be missing, as may any text), written as required: a nullable column has a
#: definition level written for each value (0.2 s of 10 million rows' 2.5 s of encoding).
_NEVER_NULL = ("rank", "pid", "attempt", "seq", "torch_seq", "nbytes", "peer", "group_size",
               "in_flight", "async", "composite", "thread", "idx", "parent")
_OPTIONS = {"use_dictionary": [name for name in _COLUMNS
                               if name not in (*_DELTAS, "duration_s", "waited_s")],
            "column_encoding": {name: "DELTA_BINARY_PACKED" for name in _DELTAS},
            "write_statistics": [name for name in _COLUMNS if name not in (
                *_TEXT, "nbytes", "peer", "group_size", "in_flight", "async", "composite",
                "thread", "parent")]}


#: The file is written through a buffer of this size: the writer's own writes are a page of a
#: column each (31,000 write and 17,000 lseek calls for 10 million rows, 0.6 s of the writing
#: thread's time, unbuffered).
_BUFFER = 8 << 20


class _Writer:
    """A Parquet file written by a thread of its own, a table at a time (``put``: at most one
    waiting); its first error raised in the caller's thread, at the next ``put`` or at the
    end."""

    def __init__(self, part: Path) -> None:
        self.part = part
        self.tables: queue.Queue = queue.Queue(maxsize=1)
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._write, name="nccl-doctor-parquet",
                                       daemon=True)
        self.started = False

    def __enter__(self) -> _Writer:
        return self

    def put(self, table: pa.Table) -> None:
        if self.error is not None:
            raise self.error
        if not self.started:
            self.started = True
            self.thread.start()
        while self.thread.is_alive():
            try:
                self.tables.put(table, timeout=0.1)
                return
            except queue.Full:  # the writer is busy (or failed: then it drains the queue)
                if self.error is not None:
                    raise self.error from None
        if self.error is not None:
            raise self.error

    def _write(self) -> None:
        import pyarrow as pa
        import pyarrow.parquet as pq

        writer = sink = None
        try:
            while True:
                table = self.tables.get()
                if table is None:
                    break
                if writer is None:
                    sink = pa.output_stream(self.part, buffer_size=_BUFFER)
                    writer = pq.ParquetWriter(sink, table.schema, **_OPTIONS)
                writer.write_table(table)
        except BaseException as err:  # (raised in the caller's thread)
            self.error = err
            while self.tables.get() is not None:  # let the caller finish putting
                pass
        finally:
            for closing in (writer, sink):  # (the writer's footer, then the buffer's rest)
                if closing is not None:
                    try:
                        closing.close()
                    except BaseException as err:
                        self.error = self.error or err

    def __exit__(self, *exc: object) -> None:
        if self.started:
            self.tables.put(None)
            self.thread.join()
        if self.error is not None and exc[0] is None:
            raise self.error


def _as(table: pa.Table, schema: pa.Schema) -> pa.Table:
    """``table`` under ``schema``: its columns as they are where their types are the schema's
    already (``Job.iter_calls``' Arrow tables: no cast, nor pyarrow.compute imported for one),
    else cast (a DataFrame's narrower codes)."""
    import pyarrow as pa

    if table.schema.names == schema.names and all(
            table.schema.field(i).type == f.type for i, f in enumerate(schema)):
        return pa.Table.from_arrays(table.columns, schema=schema)
    return table.cast(schema)


def _schema(schema: pa.Schema, full: tuple[str, ...] = ()) -> pa.Schema:
    """One schema for every chunk: text columns as dictionaries of 32-bit indices (a chunk's
    pandas codes may be narrower), without pandas' per-chunk metadata; the columns never null
    and those named ``full`` required."""
    import pyarrow as pa

    from nccl_doctor.data.columns import TEXT

    fields = []
    for f in schema:
        if f.name in TEXT:
            f = pa.field(f.name, pa.dictionary(pa.int32(), pa.string()))
        fields.append(f.with_nullable(f.name not in (*_NEVER_NULL, *full)))
    return pa.schema(fields)
