"""The calls table's pure parts: distinct places, recoding into the table's categories, calls
in flight, and a table of no call keeping the schema of a full one."""

from __future__ import annotations

import numpy as np
import pyarrow.parquet as pq

from nccl_doctor.data import columns, export


def test_distinct_rows_are_numbered_as_a_sort_would_group_them():
    rng = np.random.default_rng(7)
    cols = [rng.integers(0, k, 5000).astype(np.uint32) for k in (3, 50, 2, 4, 900, 1)]
    inverse, uniq = columns._distinct(cols)
    rows = np.stack(cols, axis=1).astype(np.int64)
    assert len(uniq) == len(np.unique(rows, axis=0))
    # every row's number names its own tuple
    assert [uniq[i] for i in inverse[:200].tolist()] == [tuple(r) for r in rows[:200].tolist()]
    assert columns._distinct([np.zeros(0, np.uint32)])[1] == []


def test_a_part_recoded_keeps_its_values_and_its_missing_ones():
    table = columns.categories()
    table["op"].code("broadcast")  # the table already holds another value
    own = columns.categories()
    codes = np.array([own["op"].code("all_reduce"), -1, own["op"].code("broadcast"), 0],
                     dtype=np.int32)
    part = {name: np.zeros(4, dtype=np.int32) for name in columns.TEXT}
    part["op"] = codes
    out = columns.recoded(part, own, table)
    assert [table["op"].values[c] if c >= 0 else None for c in out["op"]] == [
        "all_reduce", None, "broadcast", "all_reduce"]


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
