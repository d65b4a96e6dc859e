"""The Python API and ``export`` on a large job: ``nccl_doctor.open(DIR).calls`` of N ranks x M
collectives into one pandas DataFrame, and ``nccl-doctor export DIR -o FILE.parquet``.

Writes the synthetic hung job of benchmarks/scale_job.py (the same one replay_scale.py times)
as a capture directory with the project's CaptureWriter, then times each as a subprocess -
wall clock with the interpreter's start and the imports, and peak memory (the largest process,
wait4) - and checks the row count: N x M rows, each rank's calls. The export is read back with
pyarrow and its row count checked too.

Goals at 1,024 ranks x 10,000 calls (issue 52; issue 34 asked for "seconds"): ``calls`` within 4 s,
the export within 3 s, each with the interpreter's start and its imports. The last line is

  dataframe_scale ranks=N collectives=M rows=R calls_s=X calls_mib=Y export_s=Z export_mib=W

(calls_s, calls_mib: until the DataFrame is made, from the child's launch; export_s, export_mib:
the export's whole run.)

    python benchmarks/dataframe_scale.py --ranks 1024 --collectives 10000 [--jobs 2] [--keep DIR]

``--keep DIR`` keeps what was written; run again with the same DIR and job, it reuses the
captures (replay_scale.py's ``--keep`` writes the same ones: one DIR serves both).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import scale_job  # noqa: E402
from _child import timed  # noqa: E402
from _results import record  # noqa: E402

# (argv[2]: when the parent started it, time.time(): "made" is the DataFrame's time from the
# launch, the interpreter's start and the imports included, and its peak memory; the checks
# after it - a groupby over the 10 million rows - are the rest of the child's wall time)
CALLS = """
import sys, time
import resource, nccl_doctor
t0 = time.perf_counter()
calls = nccl_doctor.open(sys.argv[1]).calls
t1 = time.perf_counter()
made, peak = time.time() - float(sys.argv[2]), resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
print("made_s", round(made, 2))
print("made_mib", round(peak / 1024))
print("frame_s", round(t1 - t0, 2))
print("rows", len(calls), "ranks", calls["rank"].nunique())
print("table_mib", round(calls.memory_usage(deep=True).sum() / 2**20))
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
    ap.add_argument("--keep", type=Path, default=None, metavar="DIR",
                    help="write the job here and keep it; a DIR an earlier --keep run of the "
                         "same job left is reused (its captures are not written again)")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="nd-frame-") as tmp:
        root = args.keep or Path(tmp)
        try:
            return _bench(args, root)
        except FileExistsError as err:
            ap.error(f"--keep {args.keep}: {err}")


def _bench(args: argparse.Namespace, root: Path) -> int:
    n, m = args.ranks, args.collectives
    job = scale_job.make_job(n, m, args.tp, args.seed)
    capture = root / "capture"
    print(f"writing {n} ranks x {m} collectives ...", flush=True)
    root.mkdir(parents=True, exist_ok=True)
    reused = scale_job.written("capture", capture, job, args.seed, args.jobs, False)
    used, _ = scale_job.disk_usage(capture)
    print(f"capture: {n} files, {used / 2**20:.0f} MiB{' (reused)' if reused else ''}")
    calls = timed([sys.executable, "-c", CALLS, str(capture), repr(time.time())], args.timeout,
                  root / "calls.log")
    print(calls.output.strip())
    said = {w[0]: w[1] for line in calls.output.splitlines() for w in [line.split()]
            if len(w) > 1}
    rows = int(said.get("rows", -1))
    made_s, made_mib = float(said.get("made_s", "nan")), float(said.get("made_mib", "nan"))
    print(f"open(DIR).calls: the DataFrame {made_s:.2f} s from the launch (interpreter and "
          f"imports included), peak {made_mib:.0f} MiB; the child's whole run (a groupby check "
          f"after) {calls.seconds:.1f} s, peak {calls.peak_mib:.0f} MiB; {rows} rows")
    table = root / "calls.parquet"
    export = timed([sys.executable, "-m", "nccl_doctor", "export", str(capture), "-o",
                    str(table), "--force"], args.timeout, root / "export.log")
    print(export.output.strip())
    import pyarrow.parquet as pq
    written = pq.ParquetFile(table).metadata.num_rows if export.ok else -1
    print(f"export to Parquet: {export.seconds:.1f} s wall, peak {export.peak_mib:.0f} MiB, "
          f"{table.stat().st_size / 2**20 if table.exists() else 0:.0f} MiB file, "
          f"{written} rows read back")
    if (n, m) == (1024, 10000):
        for what, took, goal in (("open(DIR).calls", made_s, 4.0),
                                 ("export", export.seconds, 3.0)):
            print(f"  {what}: {took:.2f} s (goal <= {goal:.0f} s): "
                  f"{'ok' if took <= goal else 'OVER'}")
    ok = calls.ok and export.ok and rows == written == n * m
    if not ok:
        print(f"FAILED: expected {n * m} rows", file=sys.stderr)
    line = (f"dataframe_scale ranks={n} collectives={m} rows={rows} calls_s={made_s:.2f} "
            f"calls_mib={made_mib:.0f} export_s={export.seconds:.2f} "
            f"export_mib={export.peak_mib:.0f}")
    print(line)
    if ok:
        record(line)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
