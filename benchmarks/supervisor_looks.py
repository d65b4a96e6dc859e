"""What one full look at a running job costs the supervisor: reading every rank's capture (full
rings: 32768 records each) and the GPU samples (a full 4 MiB gpu.jsonl), then the passes the
straggler watch and the watchdog run. The straggler watch does this every 10 s while calls are
recorded; the watchdog once per second while nothing moves. Prints the median of ``--runs`` looks
per world size, in ms, and the share of one supervisor core that a look every 10 s takes.

A second table is what the supervisor pays since its reads follow the rings (capture/follow.py,
LiveCaptures): the first read of the job, a read when nothing was written since (the watchdog's
looks while ranks wait), and a read after each rank wrote 100 more records.

    python benchmarks/supervisor_looks.py [--runs 5] [--ranks 2 8]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

from nccl_doctor.analysis import analyze
from nccl_doctor.analysis.slow.straggler import detect_straggler
from nccl_doctor.capture import format as fmt
from nccl_doctor.capture.live_captures import LiveCaptures
from nccl_doctor.analysis.calls.loaded import load_capture_dir
from nccl_doctor.model import EventKind, EventState
from nccl_doctor.capture.writer import CaptureWriter
from nccl_doctor.gpu.readings import GpuDevice, GpuSample
from nccl_doctor.gpu.series import GpuLog

T0 = 1_700_000_000_000_000_000


def write_job(directory: Path, ranks: int) -> list[CaptureWriter]:
    writers = []
    for rank in range(ranks):
        meta = {"rank": rank, "world_size": ranks, "host": "node0", "pid": 4000 + rank,
                "local_rank": rank, "node_rank": 0, "started_ns": T0, "run_id": "bench"}
        w = CaptureWriter(directory / f"rank{rank:05d}.node0.{4000 + rank}{fmt.CAPTURE_SUFFIX}",
                          meta)
        op, group, inp = w.intern("all_reduce"), w.intern("0"), w.intern("float32[1024]")
        path, fn = w.intern("/job/train.py"), w.intern("step")
        for seq in range(1, w.capacity + 1):
            late = 30_000_000 if rank == ranks - 1 else 0
            idx = w.begin((0, T0 + seq * 100_000_000 + late, seq, 4096, 77, op, group, inp, 0,
                           path, 40, fn, path, 40, 0, -1, ranks, 0, int(EventKind.COLLECTIVE),
                           0, 0))
            w.end(idx, int(EventState.RETURNED), 1)
        writers.append(w)
    log = GpuLog(directory)
    log.header(available=True, host="node0",
               devices=[GpuDevice(i, f"GPU-{i}", "H100", 700.0) for i in range(8)])
    t = time.time()
    while (directory / "gpu.jsonl").stat().st_size < (4 << 20) - 4096:
        log.samples([GpuSample(t, i, 40.0, 20.0, 1980.0, 400.0, 50000.0, 1e5, 1e6)
                     for i in range(8)])
        t += 10.0
    return writers


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--ranks", type=int, nargs="+", default=[2, 8])
    args = parser.parse_args()
    followed = []
    print(f"{'ranks':>5} {'read ms':>9} {'straggler ms':>13} {'all passes ms':>14} "
          f"{'share of a core at 1 look/10 s':>31}")
    for ranks in args.ranks:
        with tempfile.TemporaryDirectory() as tmp:
            directory = Path(tmp)
            writers = write_job(directory, ranks)
            reads, stragglers, passes = [], [], []
            for _ in range(args.runs):
                t0 = time.perf_counter()
                traces = load_capture_dir(directory, job_ended=False)
                t1 = time.perf_counter()
                found = detect_straggler(traces)
                t2 = time.perf_counter()
                analyze(traces)
                t3 = time.perf_counter()
                reads.append(t1 - t0)
                stragglers.append(t2 - t1)
                passes.append(t3 - t2)
            assert found and found[0].ranks == (ranks - 1,), found  # the benchmark measures work
            read, strag, full = (statistics.median(x) * 1e3 for x in (reads, stragglers, passes))
            print(f"{ranks:>5} {read:>9.0f} {strag:>13.0f} {full:>14.0f} "
                  f"{(read + strag) / 10_000:>30.1%}")
            followed.append((ranks, *follow(directory, writers, args.runs)))
    print(f"\n{'ranks':>5} {'first read ms':>14} {'nothing new ms':>15} "
          f"{'100 new/rank ms':>16}  (followed reads: LiveCaptures)")
    for ranks, first, idle, more in followed:
        print(f"{ranks:>5} {first:>14.0f} {idle:>15.2f} {more:>16.1f}")


def follow(directory: Path, writers: list[CaptureWriter], runs: int
           ) -> tuple[float, float, float]:
    """(first read, a read with nothing new, a read after 100 new records per rank), in ms."""
    live = LiveCaptures(directory)
    t0 = time.perf_counter()
    traces = live.load()
    first = time.perf_counter() - t0
    idle = []
    for _ in range(runs):
        t0 = time.perf_counter()
        again = live.load()
        idle.append(time.perf_counter() - t0)
        assert again is traces  # nothing moved: the same TraceSet, the analysis cached on it
    more = []
    for _ in range(runs):
        for w in writers:
            for _ in range(100):
                fields = w.record(w.count)
                assert fields is not None
                idx = w.begin(fields[1:])
                w.end(idx, int(EventState.RETURNED), 1)
        t0 = time.perf_counter()
        live.load()
        more.append(time.perf_counter() - t0)
    live.close()
    return first * 1e3, statistics.median(idle) * 1e3, statistics.median(more) * 1e3


if __name__ == "__main__":
    main()
