"""Time from deadlock to written report: a 4-rank gloo job where one rank skips a broadcast.

The deadlock begins when the last rank blocks (the latest enter time among the calls the ranks are
stuck in, from their captures); it is diagnosed when report.json is written. Prints every run and
the median.

    python benchmarks/hang_detection.py [--runs 5] [--nproc 4]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
from pathlib import Path

from nccl_doctor.analysis.align import blocked_event
from nccl_doctor.analysis.loaded import load_capture_dir
from nccl_doctor.capture.names import REPORT_JSON
from nccl_doctor.supervisor.supervisor import Supervisor
from nccl_doctor.supervisor.policy import HangPolicy

JOB = Path(__file__).parent.parent / "tests" / "integration" / "jobs" / "skip_broadcast.py"


def one_run(nproc: int, out: Path) -> float:
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone",
               f"--nproc-per-node={nproc}", str(JOB)]
    result = Supervisor(command, out, environ=dict(os.environ, SKIPPER="1"),
                        policy=HangPolicy()).run()
    if not result.stopped_for_hang:
        raise SystemExit(f"run in {out}: the hang was not diagnosed (exit {result.exit_status})")
    return deadlock_to_report(out)


def deadlock_to_report(out: Path) -> float:
    """Seconds from the last rank blocking (the latest enter time among the calls the ranks
    are stuck in) to report.json written, in the run directory ``out`` of a called hang."""
    traces = load_capture_dir(out)
    blocked = [blocked_event(t) for t in traces.ranks.values()]
    deadlock_ns = max(e.t_enter_ns for e in blocked if e is not None)
    written_ns = (out / REPORT_JSON).stat().st_mtime_ns
    verdict = json.loads((out / REPORT_JSON).read_text())["verdict"]
    if verdict != "hang":
        raise SystemExit(f"run in {out}: the hang was not called (verdict {verdict})")
    return (written_ns - deadlock_ns) / 1e9


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--nproc", type=int, default=4)
    args = parser.parse_args()
    times = []
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(args.runs):
            seconds = one_run(args.nproc, Path(tmp) / f"run{i}")
            times.append(seconds)
            print(f"  run {i + 1}: deadlock -> report.json in {seconds:.2f} s")
    print(f"{args.nproc}-rank job, one rank skips a broadcast: deadlock -> written report, "
          f"median {statistics.median(times):.2f} s over {len(times)} runs "
          f"(min {min(times):.2f}, max {max(times):.2f}); goal: within 5 s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
