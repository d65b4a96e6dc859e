"""Writing a job's calls table to a file (``nccl-doctor export``): Parquet through pyarrow, or
CSV, the columns of ``Job.calls``.

The table is written a few ranks at a time (``Job.iter_calls``): a large job is never held
whole, let alone twice. The file is written beside its name and moved there once complete, so
an interrupted export leaves no half-written table under the name asked for.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING, Iterable

from nccl_doctor.errors import UsageError

if TYPE_CHECKING:  # pandas (and the columns, which need it) at the write: the CLI's parser
    import pandas as pd  # imports this module for FORMATS, and `run` must not pay for pandas
    import pyarrow as pa

FORMATS = ("parquet", "csv")
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


def write(chunks: Iterable[pd.DataFrame], path: Path, fmt: str) -> int:
    """Write ``chunks`` (frames of the same columns) to ``path`` as ``fmt``; rows written.
    Raises OSError as the filesystem does, ImportError when Parquet lacks pyarrow."""
    part = path.with_name(f".{path.name}.part")
    try:
        rows = (_parquet if fmt == "parquet" else _csv)(chunks, part)
        os.replace(part, path)
    finally:
        if part.exists():
            part.unlink()
    return rows


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


def _parquet(chunks: Iterable[pd.DataFrame], part: Path) -> int:
    import pyarrow as pa
    import pyarrow.parquet as pq

    from nccl_doctor.data import columns

    writer: pq.ParquetWriter | None = None
    schema: pa.Schema | None = None
    rows = 0
    try:
        for chunk in chunks:
            table = pa.Table.from_pandas(chunk, preserve_index=False)
            if schema is None:
                schema = _schema(table.schema)
                writer = pq.ParquetWriter(part, schema)
            assert writer is not None
            writer.write_table(table.cast(schema))
            rows += len(chunk)
        if writer is None:  # no call recorded: an empty table of the same columns
            empty = pa.Table.from_pandas(columns.frame([], columns.categories()),
                                         preserve_index=False)
            pq.write_table(empty.cast(_schema(empty.schema)), part)
    finally:
        if writer is not None:
            writer.close()
    return rows


def _schema(schema: pa.Schema) -> pa.Schema:
    """One schema for every chunk: text columns as dictionaries of 32-bit indices (a chunk's
    pandas codes may be narrower), without pandas' per-chunk metadata."""
    import pyarrow as pa

    from nccl_doctor.data.columns import TEXT

    fields = []
    for f in schema:
        if f.name in TEXT:
            f = pa.field(f.name, pa.dictionary(pa.int32(), pa.string()))
        fields.append(f)
    return pa.schema(fields)
