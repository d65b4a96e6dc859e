"""The Python API and ``export`` on real stopped hangs (issue 34): ``nccl_doctor.open(...)``'s
tables and diagnosis are what replay reads and says; export writes the same rows."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pyarrow.parquet as pq
import pytest

import nccl_doctor
from nccl_doctor.errors import CaptureNotFound, ExitStatus

pytestmark = pytest.mark.integration

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"


def _cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "nccl_doctor", *args], capture_output=True,
                          text=True, timeout=120)


def test_a_job_opened_is_what_replay_reads_and_says(stopped_hang, data_check):
    replay_calls, plain = data_check
    out = stopped_hang("skip_broadcast").sup.out_dir
    job = nccl_doctor.open(out)
    replayed = _cli("replay", str(out), "--format", "json")
    assert replayed.returncode == 0, replayed.stderr
    report = json.loads(replayed.stdout)
    assert json.loads(job.diagnose().to_json_text()) == report
    # the calls, row for row
    calls = job.calls
    pd.testing.assert_frame_equal(plain(calls), plain(replay_calls(out)))
    # the culprit's calls say what the report says: rank 1 never entered the broadcast
    root = next(f for f in report["findings"] if f["root_cause"])
    group, seq = root["group"], root["seq"]
    at = calls[(calls["group"] == group) & (calls["seq"] == seq)]
    assert set(at["rank"]) == set(range(3)) and at["op"].nunique() == 2, at
    assert set(at.loc[at["op"] == "all_reduce", "rank"]) == set(root["ranks"])
    waiting = at[at["state"] == "entered"]
    assert waiting["t_exit"].isna().all() and waiting["duration_s"].isna().all()
    done = calls[calls["state"] == "returned"]
    assert (done["duration_s"] >= 0).all() and done["callsite"].str.contains(
        "skip_broadcast.py:").all()
    # ranks, groups and notes: the report's
    ranks = job.ranks
    assert ranks["rank"].tolist() == [r["rank"] for r in report["ranks"]]
    assert ranks["pid"].tolist() == [r["pid"] for r in report["ranks"]]
    assert (ranks["exit"] == "stopped").all(), ranks[["rank", "exit", "exit_detail"]]
    assert {g: list(r) for g, r in zip(job.groups["group"], job.groups["ranks"])} == {
        g: list(r) for g, r in report["groups"].items()}
    assert (job.notes.groupby("rank")["note"].apply(lambda s: (s == "group").sum()) >= 1).all()


def test_flight_recorder_calls_join_the_table(tmp_path, stopped_hang, data_check):
    """DDP's gradient all_reduce is issued from C++: no rank recorded it, Flight Recorder saw
    it. Given the job's dumps (``fr=``), the table holds those calls too, marked so."""
    _, plain = data_check
    out = tmp_path / "out"
    shutil.copytree(stopped_hang("ddp_uneven").sup.out_dir, out)
    fr = tmp_path / "fr"
    shutil.move(str(out / "flight_recorder"), fr)
    recorded = nccl_doctor.open(out).calls
    assert set(recorded["source"]) == {"recorder"}
    merged = nccl_doctor.open(out, fr=fr).calls
    from_fr = merged[merged["source"] == "flight_recorder"]
    assert len(from_fr) > 0 and "all_reduce" in set(from_fr["op"])
    # the recorder's rows are untouched, the table still in rank and record order
    pd.testing.assert_frame_equal(
        plain(merged[merged["source"] == "recorder"]).reset_index(drop=True), plain(recorded))
    assert merged["rank"].is_monotonic_increasing
    # and export writes them all
    table = tmp_path / "calls.parquet"
    proc = _cli("export", str(out), "--fr", str(fr), "-o", str(table))
    assert proc.returncode == 0 and f"Wrote {len(merged)} calls" in proc.stderr, proc.stderr
    back = pq.read_table(table).to_pandas()
    pd.testing.assert_frame_equal(plain(back), plain(merged))


@pytest.mark.parametrize("dumps", ["gloo_skip_broadcast", "h100_nccl_shape_mismatch"])
def test_flight_recorder_dumps_alone_open_as_a_job(dumps):
    """A directory of Flight Recorder dumps (gloo here, and a real H100 NCCL run): one row per
    entry replay reads, the same diagnosis."""
    where = FIXTURES / "fr_dumps" / dumps
    job = nccl_doctor.open(where)
    calls = job.calls
    traces = job.traces
    assert len(calls) == sum(len(t.events) for t in traces.ranks.values()) > 0
    assert set(calls["source"]) == {"flight_recorder"}
    assert sorted(calls["rank"].unique()) == sorted(traces.ranks)
    replayed = _cli("replay", str(where), "--format", "json")
    assert json.loads(job.diagnose().to_json_text()) == json.loads(replayed.stdout)


def test_several_nodes_one_capture_file_and_bad_paths(tmp_path, stopped_hang, data_check):
    _, plain = data_check
    out = stopped_hang("skip_broadcast").sup.out_dir
    whole = nccl_doctor.open(out).calls
    # one directory holding the nodes' directories (after an rsync)
    shutil.copytree(out, tmp_path / "nodes" / "node0")
    pd.testing.assert_frame_equal(plain(nccl_doctor.open(tmp_path / "nodes").calls),
                                  plain(whole))
    # one rank's capture file
    one = sorted(out.glob("rank00001.*.ndcap"))[0]
    single = nccl_doctor.open(one).calls
    pd.testing.assert_frame_equal(
        plain(single), plain(whole[whole["rank"] == 1]).reset_index(drop=True))
    with pytest.raises(CaptureNotFound, match="does not exist"):
        nccl_doctor.open(tmp_path / "nowhere")
    with pytest.raises(TypeError):
        nccl_doctor.open()


def test_export_says_what_is_wrong_in_one_line(tmp_path, stopped_hang):
    out = stopped_hang("skip_broadcast").sup.out_dir
    csv = tmp_path / "calls.csv"
    ok = _cli("export", str(out), "-o", str(csv))
    assert ok.returncode == 0, ok.stderr
    assert len(pd.read_csv(csv)) == len(nccl_doctor.open(out).calls)
    cases = [
        (["export", str(out), "-o", str(csv)], ExitStatus.OUTPUT_EXISTS, "--force"),
        (["export", str(out), "-o", str(tmp_path / "calls.txt")], ExitStatus.USAGE, ".parquet"),
        (["export", str(tmp_path / "nowhere"), "-o", str(tmp_path / "x.csv")],
         ExitStatus.NOT_FOUND, "does not exist"),
        (["export", str(out), "-o", str(tmp_path / "no" / "such" / "dir.csv")],
         ExitStatus.UNWRITABLE, "cannot write there"),
        (["export", str(out)], ExitStatus.USAGE, "-o"),
    ]
    for args, status, said in cases:
        proc = _cli(*args)
        assert proc.returncode == status, (args, proc.returncode, proc.stderr)
        lines = proc.stderr.strip().splitlines()
        assert len(lines) == 1 and said in lines[0] and "Traceback" not in proc.stderr, lines
    assert not list(tmp_path.glob(".*.part")) and not (tmp_path / "calls.txt").exists()


def test_the_documented_plotting_example_runs_on_a_real_job(tmp_path, stopped_hang):
    """docs/examples/durations.py (the notebook-style example of docs/python-api.md) opens a
    run and writes its figure."""
    out = stopped_hang("skip_broadcast").sup.out_dir
    example = Path(__file__).resolve().parents[2] / "docs" / "examples" / "durations.py"
    png = tmp_path / "durations.png"
    proc = subprocess.run([sys.executable, str(example), str(out), str(png)],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.startswith(f"wrote {png}: per-rank medians (ms) {{0: ")
    from PIL import Image
    with Image.open(png) as img:
        assert img.format == "PNG" and img.size[0] > 600 and len(img.getcolors(1 << 16)) > 10


def test_a_call_flight_recorder_saw_unfinished_reads_in_flight(tmp_path, stopped_hang,
                                                                data_check):
    """On NCCL a call returns once enqueued; Flight Recorder says whether its work completed.
    Rank 0's dump (NCCL's entry states, written for this real gloo capture) says its last
    returned collective never completed: with ``fr=``, that row reads entered and in flight,
    as replay's merged read says - row for row."""
    replay_calls, plain = data_check
    out = stopped_hang("skip_broadcast").sup.out_dir
    calls = nccl_doctor.open(out).calls
    mine = calls[(calls["rank"] == 0) & (calls["group"] == "0")]
    returned = mine[mine["state"] == "returned"]
    last = int(returned["seq"].iloc[-1])
    entries = [{
        "record_id": i, "pg_id": 0, "process_group": ["0", "default_pg"],
        "collective_seq_id": int(row.seq), "p2p_seq_id": 0, "op_id": int(row.seq),
        "profiling_name": f"nccl:{row.op}", "is_p2p": False,
        "input_sizes": [[16]], "input_dtypes": ["Float"], "output_sizes": [[16]],
        "output_dtypes": ["Float"], "state": "started" if row.seq == last else "completed",
        "retired": row.seq != last, "time_created_ns": int(row.t_enter.value),
        "time_discovered_started_ns": int(row.t_enter.value),
        "time_discovered_completed_ns": 0, "thread_id": "1", "thread_name": "python",
        "timeout_ms": 600000} for i, row in enumerate(returned.itertuples())]
    fr = tmp_path / "fr"
    fr.mkdir()
    (fr / "rank_0.json").write_text(json.dumps({"version": "2.10", "entries": entries}))
    job = nccl_doctor.open(out, fr=fr)
    merged = job.calls
    flying = merged[merged["in_flight"]]
    assert [(int(r.rank), int(r.seq)) for r in flying.itertuples()] == [(0, last)], flying
    assert flying["state"].tolist() == ["entered"] and flying["t_exit"].isna().all()
    assert flying["duration_s"].isna().all()
    # every row as replay's merged read has it
    from nccl_doctor.capture.capture_set import CaptureSet
    from nccl_doctor.data import columns
    from nccl_doctor.data.job import job_end
    cats = columns.categories()
    ended = job_end(CaptureSet(out), out)  # (the hung calls wait until the stop)
    reference = columns.frame([columns.trace_columns(t, cats, job_end=ended)
                               for _, t in sorted(job.traces.ranks.items())], cats)
    pd.testing.assert_frame_equal(plain(merged), plain(reference))
    # without the dump, the same row is what the rank recorded: returned
    row = calls[(calls["rank"] == 0) & (calls["group"] == "0") & (calls["seq"] == last)]
    assert row["state"].tolist() == ["returned"] and not row["in_flight"].any()
