"""Time from deadlock to written report, on 4-rank gloo jobs: one rank skips a broadcast
(``--case broadcast``, the default), or the hang is outside any collective (issue 50):
``group`` (new_group made by its members only: tests/integration/jobs/group_creation.py),
``store`` (a rank in a store barrier while its peer waits in an all_reduce:
jobs/blocked_waits.py, 2 ranks) and ``rendezvous`` (a rank told another MASTER_PORT:
jobs/rendezvous.py, no capture exists).

The deadlock begins when the last rank blocks (the latest enter time among the calls the ranks are
stuck in, from their captures; for a wait outside collectives, the latest record or the latest
rank's joining record); it is diagnosed when report.json is written. Prints every run and the
median.

    python benchmarks/hang_detection.py [--runs 5] [--nproc 4] [--case broadcast|group|store|rendezvous]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
from pathlib import Path

from nccl_doctor.analysis.calls.align import blocked_event
from nccl_doctor.analysis.calls.loaded import load_capture_dir
from nccl_doctor.capture.names import REPORT_JSON
from nccl_doctor.supervisor.supervisor import Supervisor
from nccl_doctor.supervisor.policy import HangPolicy

JOBS = Path(__file__).parent.parent / "tests" / "integration" / "jobs"
#: case -> (job, its environment, ranks (None: --nproc), what it is)
CASES = {
    "broadcast": ("skip_broadcast.py", {"SKIPPER": "1"}, None, "one rank skips a broadcast"),
    "group": ("group_creation.py", {"SCENARIO": "members_only"}, 4,
              "new_group made by its members only"),
    "store": ("blocked_waits.py", {"SCENARIO": "store_wait"}, 2,
              "a rank in a store barrier, its peer in all_reduce"),
    "rendezvous": ("rendezvous.py", {"SCENARIO": "wrong_port"}, 3,
                   "a rank told another MASTER_PORT"),
}


def one_run(case: str, nproc: int, out: Path) -> float:
    job, env, _, _ = CASES[case]
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone",
               f"--nproc-per-node={nproc}", str(JOBS / job)]
    result = Supervisor(command, out, environ=dict(os.environ, **env),
                        policy=HangPolicy()).run()
    if not result.stopped_for_hang:
        raise SystemExit(f"run in {out}: the hang was not diagnosed (exit {result.exit_status})")
    return deadlock_to_report(out, outside=case != "broadcast")


def deadlock_to_report(out: Path, outside: bool = False) -> float:
    """Seconds from the last rank blocking (the latest enter time among the calls the ranks
    are stuck in; ``outside``: the latest record of any rank, or joining record where no
    capture exists) to report.json written, in the run directory ``out`` of a called hang."""
    traces = load_capture_dir(out)
    if outside:
        deadlock_ns = max([e.t_enter_ns for t in traces.ranks.values() for e in t.events[-1:]]
                          + [j.time_ns for j in traces.joining.values()])
    else:
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
    parser.add_argument("--case", choices=sorted(CASES), default="broadcast")
    args = parser.parse_args()
    times = []
    _, _, ranks, what = CASES[args.case]
    nproc = ranks or args.nproc
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(args.runs):
            seconds = one_run(args.case, nproc, Path(tmp) / f"run{i}")
            times.append(seconds)
            print(f"  run {i + 1}: deadlock -> report.json in {seconds:.2f} s")
    print(f"{nproc}-rank job, {what}: deadlock -> written report, "
          f"median {statistics.median(times):.2f} s over {len(times)} runs "
          f"(min {min(times):.2f}, max {max(times):.2f}); goal: within 5 s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
