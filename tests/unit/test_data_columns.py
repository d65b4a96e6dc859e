"""The calls table's pure parts: distinct places, the table coding its parts' text, calls in
flight, timestamps and Arrow tables as pandas and pyarrow make them, and a table of no call
keeping the schema of a full one."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pyarrow.parquet as pq

from nccl_doctor.data import columns, export


def test_distinct_rows_are_numbered_as_the_rows_first_show_them():
    rng = np.random.default_rng(7)
    cols = [rng.integers(0, k, 5000).astype(np.uint32) for k in (3, 50, 2, 4, 900, 1)]
    inverse, uniq = columns._distinct(cols)
    rows = np.stack(cols, axis=1).astype(np.int64)
    assert len(uniq) == len(np.unique(rows, axis=0))
    # every row's number names its own tuple, numbered as the rows first show them
    assert [uniq[i] for i in inverse[:200].tolist()] == [tuple(r) for r in rows[:200].tolist()]
    assert inverse[0] == 0 and np.all(np.maximum.accumulate(inverse) >= inverse)
    assert columns._distinct([np.zeros(0, np.uint32)])[1] == []


def test_the_table_codes_each_part_s_text_and_keeps_its_missing_values():
    cats = columns.categories()
    cats["op"].code("broadcast")  # the table already holds another value
    part = {name: np.zeros(4, dtype=columns._EMPTY.get(name, np.int32))
            for name in columns.COLUMNS}
    part["op"] = np.array([cats["op"].code("all_reduce"), -1, cats["op"].code("broadcast"), 0],
                          dtype=np.int32)
    for name in columns.TEXT:
        if name != "op":
            part[name] = np.full(4, cats[name].code("x"), dtype=np.int32)
    out = columns.frame([part], cats)
    assert out["op"].isna().tolist() == [False, True, False, False]
    assert out["op"].astype(object).tolist()[::2] == ["all_reduce", "broadcast"]


def test_a_table_grows_past_the_parts_it_expected():
    cats = columns.categories()
    parts = []
    for rank in range(5):
        part = {name: np.full(3 + rank, rank, dtype=columns._EMPTY.get(name, np.int32))
                for name in columns.COLUMNS}
        for name in columns.TEXT:
            part[name] = np.full(3 + rank, cats[name].code(f"{name}{rank % 2}"), np.int32)
        part["idx"] = np.arange(3 + rank, dtype=np.int64)
        parts.append(part)
    table = columns.Table(cats, expect=1)
    for part in [dict(p) for p in parts]:
        table.add(part)
    grown = table.frame()
    assert len(grown) == sum(3 + r for r in range(5))
    assert grown["rank"].tolist() == [r for r in range(5) for _ in range(3 + r)]
    assert grown["op"].tolist() == [f"op{r % 2}" for r in range(5) for _ in range(3 + r)]
    # parts out of rank order: sorted by rank and record, as one table
    shuffled = columns.frame([dict(p) for p in (parts[3], parts[0], parts[4], parts[1],
                                                parts[2])], cats)
    pd.testing.assert_frame_equal(shuffled, grown)


def test_timestamps_are_pandas_own():
    ns = np.array([1_700_000_000_123_456_789, np.iinfo(np.int64).min, 0], dtype=np.int64)
    made = pd.Series(columns.utc(ns))
    pd.testing.assert_series_equal(made, pd.Series(pd.DatetimeIndex(ns.view("M8[ns]"),
                                                                    tz="UTC")))
    assert made.isna().tolist() == [False, True, False]


def test_the_arrow_table_is_pyarrow_s_of_the_frame():
    import pyarrow as pa

    cats = columns.categories()
    n = 6
    part = {name: np.arange(n).astype(columns._EMPTY.get(name, np.int32))
            for name in columns.COLUMNS}
    for name in columns.TEXT:
        part[name] = np.array([cats[name].code(v) for v in "abab"] + [-1, 0], np.int32)
    part["t_exit"][2] = np.iinfo(np.int64).min
    part["duration_s"] = np.array([0.5, np.nan, 1, 2, 3, 4])
    part["in_flight"] = part["async"] = part["composite"] = np.arange(n) % 2 == 0
    twin = {name: col.copy() for name, col in part.items()}
    arrow = columns.Table(cats)
    arrow.add(part)
    made = arrow.arrow()
    expected = pa.Table.from_pandas(columns.frame([twin], cats), preserve_index=False)
    schema = export._schema(expected.schema)
    assert made.cast(schema).equals(expected.cast(schema))
    assert made.column("duration_s").null_count == 1 and made.column("t_exit").null_count == 1


def test_a_parquet_file_that_cannot_be_written_is_an_os_error_and_leaves_nothing(tmp_path):
    cats = columns.categories()
    part = {name: np.zeros(3).astype(columns._EMPTY.get(name, np.int32))
            for name in columns.COLUMNS}
    for name in columns.TEXT:
        part[name] = np.full(3, cats[name].code("x"), np.int32)
    frames = [columns.frame([dict(part)], cats) for _ in range(3)]
    target = tmp_path / "no" / "such" / "calls.parquet"
    try:
        export.write(iter(frames), target, "parquet")
    except OSError:
        pass
    else:
        raise AssertionError("written where no directory is")
    assert not (tmp_path / "no").exists()
    assert export.write(iter(frames), tmp_path / "calls.parquet", "parquet") == 9
    assert pq.read_table(tmp_path / "calls.parquet").num_rows == 9
    assert [p.name for p in tmp_path.iterdir()] == ["calls.parquet"]


def test_export_names_the_columns_as_the_table_does():
    assert export._COLUMNS == tuple(columns.COLUMNS) and export._TEXT == columns.TEXT
    # required in the file: the columns held as integers or booleans, times aside (NaT)
    held = {name for name, dtype in columns.NUMBERS.items() if dtype.kind in "iub"}
    assert set(export._NEVER_NULL) == held - {"t_enter", "t_exit"}


def test_columns_the_first_chunk_fills_are_required_until_a_later_chunk_leaves_one_empty(
        tmp_path):
    """Chunks made afresh on demand (``Job.iter_calls``): what the first chunk has no empty
    value in is written required; a later chunk with one there starts the file again, with
    that column nullable - nothing lost either way."""
    cats = columns.categories()

    def chunk(function: str | None) -> pd.DataFrame:
        part = {name: np.arange(2).astype(columns._EMPTY.get(name, np.int32))
                for name in columns.COLUMNS}
        for name in columns.TEXT:
            part[name] = np.full(2, cats[name].code("x"), np.int32)
        part["function"] = np.array([cats["function"].code("f"), cats["function"].code(function)],
                                    np.int32)
        return columns.frame([part], cats)

    made = []

    def chunks(*functions):
        def again():
            made.append(1)
            return iter([chunk(f) for f in functions])
        return again

    assert export.write(chunks("g", "h"), tmp_path / "full.parquet", "parquet") == 4
    assert not pq.read_schema(tmp_path / "full.parquet").field("function").nullable
    assert len(made) == 1
    assert export.write(chunks("g", None), tmp_path / "empty.parquet", "parquet") == 4
    assert pq.read_schema(tmp_path / "empty.parquet").field("function").nullable
    assert len(made) == 3  # (read twice)
    back = pq.read_table(tmp_path / "empty.parquet").to_pandas()
    assert back["function"].tolist()[:3] == ["f", "g", "f"] and pd.isna(back["function"][3])
    assert sorted(p.name for p in tmp_path.iterdir()) == ["empty.parquet", "full.parquet"]


def test_a_parquet_file_has_its_never_null_columns_required_and_reads_back_the_same(tmp_path):
    cats = columns.categories()
    part = {name: np.arange(4).astype(columns._EMPTY.get(name, np.int32))
            for name in columns.COLUMNS}
    part["t_exit"] = np.array([1, columns._NAT, 3, 4])
    part["duration_s"] = np.array([0.5, np.nan, 1.0, 2.0])
    for name in columns.TEXT:
        part[name] = np.array([cats[name].code("x"), -1, cats[name].code("y"), -1], np.int32)
    frame = columns.frame([dict(part)], cats)
    export.write(iter([frame]), tmp_path / "calls.parquet", "parquet")
    schema = pq.read_schema(tmp_path / "calls.parquet")
    assert {f.name for f in schema if not f.nullable} == set(export._NEVER_NULL)
    back = pq.read_table(tmp_path / "calls.parquet").to_pandas()
    assert back["t_exit"].isna().tolist() == [False, True, False, False]
    assert back["function"].isna().tolist() == [False, True, False, True]
    assert back["rank"].tolist() == [0, 1, 2, 3]


def test_export_writes_parquet_without_pandas(tmp_path):
    """The calls of a capture exported to Parquet as Arrow tables, pandas never imported."""
    import subprocess
    import sys

    from nccl_doctor.capture import format as fmt
    from nccl_doctor.capture.writer import CaptureWriter
    from nccl_doctor.model import EventKind

    w = CaptureWriter(tmp_path / f"rank00000.node0.1{fmt.CAPTURE_SUFFIX}",
                      {"rank": 0, "world_size": 1, "host": "node0", "pid": 1})
    for seq in range(1, 6):
        idx = w.begin((0, 10 + seq, seq, 4, 1, w.intern("all_reduce"), w.intern("0"),
                       w.intern("float32[1]"), 0, 0, 0, 0, 0, 0, 0, -1, 1, 0,
                       int(EventKind.COLLECTIVE), 0, 0))
        w.end(idx, 1, 1)
    out = tmp_path / "calls.parquet"
    code = ("import sys\n"
            "from nccl_doctor.data import export\n"
            "from nccl_doctor.data.job import Job\n"
            f"rows = export.write(Job({str(w.path)!r}).iter_calls(), "
            f"__import__('pathlib').Path({str(out)!r}), 'parquet')\n"
            "print(rows, 'pandas' in sys.modules)")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          check=True)
    assert done.stdout.split() == ["5", "False"]
    assert pq.read_table(out).column("seq").to_pylist() == [1, 2, 3, 4, 5]


def test_calls_in_flight_lose_their_exit():
    cats = columns.categories()
    returned, entered = cats["state"].code("returned"), cats["state"].code("entered")
    part = {"idx": np.array([1, 2, 3]), "state": np.full(3, returned, np.int32),
            "in_flight": np.zeros(3, bool), "t_exit": np.array([10, 20, 30]),
            "duration_s": np.array([1.0, 2.0, 3.0])}
    out = columns.in_flight(part, {2}, cats)
    assert out["state"].tolist() == [returned, entered, returned]
    assert out["in_flight"].tolist() == [False, True, False]
    assert out["t_exit"][1] == np.iinfo(np.int64).min and np.isnan(out["duration_s"][1])
    assert columns.in_flight(part, set(), cats) is part


def test_a_table_of_no_call_has_the_full_tables_schema(tmp_path):
    empty = columns.frame([], columns.categories())
    assert list(empty.columns) == list(columns.COLUMNS) and len(empty) == 0
    cats = columns.categories()
    part = {name: np.zeros(1, dtype=columns._EMPTY.get(name, np.int32)) for name in columns.COLUMNS}
    for name in columns.TEXT:
        part[name] = np.array([cats[name].code("x")], dtype=np.int32)
    one = columns.frame([part], cats)
    assert empty.dtypes.astype(str).tolist() == one.dtypes.astype(str).tolist()
    assert export.write(iter([]), tmp_path / "none.parquet", "parquet") == 0
    assert export.write(iter([one]), tmp_path / "one.parquet", "parquet") == 1
    assert pq.read_schema(tmp_path / "none.parquet").names == list(columns.COLUMNS)
    assert pq.read_schema(tmp_path / "none.parquet").types == \
        pq.read_schema(tmp_path / "one.parquet").types
    assert export.write(iter([]), tmp_path / "none.csv", "csv") == 0
    assert (tmp_path / "none.csv").read_text() == ",".join(columns.COLUMNS) + "\n"
