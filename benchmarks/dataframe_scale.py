"""The Python API and ``export`` on a large job: ``nccl_doctor.open(DIR).calls`` of N ranks x M
collectives into one pandas DataFrame, and ``nccl-doctor export DIR -o FILE.parquet``.

Writes the synthetic hung job of benchmarks/scale_job.py (the same one replay_scale.py times)
as a capture directory with the project's CaptureWriter, then times each as a subprocess -
wall clock with the interpreter's start and the imports, and peak memory (the largest process,
wait4) - and checks the row count: N x M rows, each rank's calls. The export is read back with
pyarrow and its row count checked too.

Goal (issue 34): 1,024 ranks x 10,000 calls into a DataFrame "in seconds". The last line is

  dataframe_scale ranks=N collectives=M rows=R calls_s=X calls_mib=Y export_s=Z export_mib=W

    python benchmarks/dataframe_scale.py --ranks 1024 --collectives 10000 [--jobs 2]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import scale_job  # noqa: E402
from _child import timed  # noqa: E402

CALLS = """
import sys, time, nccl_doctor
t0 = time.perf_counter()
calls = nccl_doctor.open(sys.argv[1]).calls
t1 = time.perf_counter()
print("rows", len(calls), "ranks", calls["rank"].nunique())
print("frame_s", round(t1 - t0, 2), "mib", round(calls.memory_usage(deep=True).sum() / 2**20))
print(calls.groupby("op", observed=True)["duration_s"].median().round(4).to_dict())
"""


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ranks", type=int, default=1024)
    ap.add_argument("--collectives", type=int, default=10000)
    ap.add_argument("--tp", type=int, default=8)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--jobs", type=int, default=2, help="processes writing the captures")
    ap.add_argument("--timeout", type=float, default=1800)
    ap.add_argument("--keep", type=Path, default=None, help="write the job here and keep it")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="nd-frame-") as tmp:
        root = args.keep or Path(tmp)
        return _bench(args, root)


def _bench(args: argparse.Namespace, root: Path) -> int:
    n, m = args.ranks, args.collectives
    job = scale_job.make_job(n, m, args.tp, args.seed)
    capture = root / "capture"
    print(f"writing {n} ranks x {m} collectives ...", flush=True)
    scale_job.write_all("capture", capture, job, args.seed, args.jobs, False)
    used, _ = scale_job.disk_usage(capture)
    print(f"capture: {n} files, {used / 2**20:.0f} MiB")
    calls = timed([sys.executable, "-c", CALLS, str(capture)], args.timeout, root / "calls.log")
    print(calls.output.strip())
    rows = next((int(line.split()[1]) for line in calls.output.splitlines()
                 if line.startswith("rows ")), -1)
    print(f"open(DIR).calls: {calls.seconds:.1f} s wall (interpreter and imports included), "
          f"peak {calls.peak_mib:.0f} MiB, {rows} rows")
    table = root / "calls.parquet"
    export = timed([sys.executable, "-m", "nccl_doctor", "export", str(capture), "-o",
                    str(table), "--force"], args.timeout, root / "export.log")
    print(export.output.strip())
    import pyarrow.parquet as pq
    written = pq.ParquetFile(table).metadata.num_rows if export.ok else -1
    print(f"export to Parquet: {export.seconds:.1f} s wall, peak {export.peak_mib:.0f} MiB, "
          f"{table.stat().st_size / 2**20 if table.exists() else 0:.0f} MiB file, "
          f"{written} rows read back")
    ok = calls.ok and export.ok and rows == written == n * m
    if not ok:
        print(f"FAILED: expected {n * m} rows", file=sys.stderr)
    print(f"dataframe_scale ranks={n} collectives={m} rows={rows} calls_s={calls.seconds:.2f} "
          f"calls_mib={calls.peak_mib:.0f} export_s={export.seconds:.2f} "
          f"export_mib={export.peak_mib:.0f}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
