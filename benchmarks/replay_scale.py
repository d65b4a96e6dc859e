"""Replaying a large hung job: ``nccl-doctor replay`` of N ranks' captures against
``torchfrtrace`` on the same job's NCCL Flight Recorder dumps.

Writes the synthetic job of benchmarks/scale_job.py (N ranks in tensor-parallel groups of 8
consecutive ranks and data-parallel groups of strided ranks, M collectives per rank of
all_reduce / all_gather / reduce_scatter / broadcast on the three kinds of group; one culprit
rank, drawn by ``--seed`` from ranks 1..N-1, skips the world broadcast of the last step and calls
the next all_reduce instead, and every rank's last call hangs) as a capture directory with the
project's CaptureWriter, then times, as subprocesses, wall clock (process start included) and
peak memory:

  nccl-doctor replay CAPTURE --format json -o REPORT --force
  torchfrtrace DUMPS --prefix rank_          (the same calls as Flight Recorder pickle dumps)

and checks that each named the culprit: nccl-doctor's root-cause finding's ranks in its JSON
report, torchfrtrace's "Culprit rank" (else "missing ranks") lines. Peak memory is the largest
process's (wait4) and, since a replay may fan out to worker processes, the sum over the process
tree sampled every 0.1 s. The files are read from a warm page cache (they were just written).

Goals (at 1,024 ranks x 10,000 collectives, issue 52): replay <= 5 s (it was 15 s), >= 20x
faster than torchfrtrace, peak memory <= 1 GiB (it was 4 GiB). The last line is always

  replay_scale ranks=N collectives=M replay_s=X torchfrtrace_s=Y

in seconds; a run killed at its timeout (or at ``--memory-limit``) prints its elapsed time, a
lower bound, said so on an earlier line; ``--skip-torchfrtrace`` prints ``torchfrtrace_s=nan``
(it parses as a float and means "not measured"). Exit status 1 when nccl-doctor failed, was
killed or did not name exactly the culprit; torchfrtrace's outcome is reported and never
changes it.

    python benchmarks/replay_scale.py --ranks 64 --collectives 2000 [--tp 8] [--seed 0]
        [--skip-torchfrtrace] [--torchfrtrace-timeout 1800] [--replay-timeout 1800]
        [--memory-limit GiB] [--per-node] [--doctor CMD] [--jobs 2] [--keep DIR]

``--keep DIR`` keeps what was written; run again with the same DIR and job, it reuses the
captures and dumps instead of writing them again (a run that times the reading alone).
"""

from __future__ import annotations

import argparse
import math
import shlex
import shutil
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import scale_job  # noqa: E402
from _child import timed  # noqa: E402
from fr_replay import _tool, doctor_culprit, torchfrtrace_culprit  # noqa: E402
from _results import record  # noqa: E402

GOAL_S, GOAL_MIB = 5.0, 1024  # at 1,024 ranks x 10,000 collectives


def _verdict(blamed: set[int], culprit: int) -> str:
    if blamed == {culprit}:
        return "ok"
    if culprit in blamed:
        return f"MISSED: named among {len(blamed)} ranks"
    return "MISSED"


def _mib(n: int) -> str:
    return f"{n / (1 << 20):,.0f} MiB"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ranks", type=int, required=True, metavar="N")
    ap.add_argument("--collectives", type=int, required=True, metavar="M",
                    help="collectives per rank (the capture also holds the group-creation calls)")
    ap.add_argument("--tp", type=int, default=8, help="tensor-parallel group size (default 8)")
    ap.add_argument("--seed", type=int, default=0, help="draws the culprit and the timing skew")
    ap.add_argument("--skip-torchfrtrace", action="store_true",
                    help="write no dumps, run only nccl-doctor (torchfrtrace_s=nan)")
    ap.add_argument("--torchfrtrace-timeout", type=float, default=1800.0, metavar="S")
    ap.add_argument("--replay-timeout", type=float, default=1800.0, metavar="S")
    ap.add_argument("--memory-limit", type=float, default=None, metavar="GiB",
                    help="kill a tool whose processes hold more (protects a shared machine)")
    ap.add_argument("--per-node", action="store_true",
                    help="one capture directory per host (as a multi-node run leaves them) "
                         "under the one replayed")
    ap.add_argument("--doctor", default=None, metavar="CMD",
                    help="the nccl-doctor command to time (default: this environment's), e.g. "
                         "another checkout's launcher, to compare")
    ap.add_argument("--jobs", type=int, default=2, help="processes writing the files (default 2)")
    ap.add_argument("--keep", type=Path, default=None, metavar="DIR",
                    help="write the captures, dumps, report and logs under DIR and keep them; "
                         "a DIR an earlier --keep run of the same job left is reused (its "
                         "captures and dumps are not written again)")
    args = ap.parse_args()
    n, m, tp = args.ranks, args.collectives, args.tp
    if tp < 1 or n < 2 * tp or n % tp:
        ap.error(f"--ranks {n} must be a multiple of --tp {tp}, at least twice it")
    if m < scale_job.STEP_LEN + scale_job.HANG_AT + 1:
        ap.error(f"--collectives must be at least {scale_job.STEP_LEN + scale_job.HANG_AT + 1} "
                 "(one training step and the hung one)")
    if args.keep is not None and args.keep.exists() and not args.keep.is_dir():
        ap.error(f"--keep {args.keep}: pass a directory")

    root = args.keep or Path(tempfile.mkdtemp(prefix="replay-scale-"))
    root.mkdir(parents=True, exist_ok=True)
    try:
        return _bench(ap, args, root, n, m, tp)
    finally:
        if args.keep is None:
            shutil.rmtree(root, ignore_errors=True)


def _written(ap: argparse.ArgumentParser, what: str, directory: Path, job: scale_job.Job,
             args: argparse.Namespace) -> bool:
    """The job's captures or dumps written into ``directory``, or reused (``--keep``)."""
    try:
        return scale_job.written(what, directory, job, args.seed, args.jobs,
                                 args.per_node and what == "capture")
    except FileExistsError as err:
        ap.error(f"--keep {args.keep}: {err}")


def _bench(ap: argparse.ArgumentParser, args: argparse.Namespace, root: Path, n: int, m: int,
           tp: int) -> int:
    job = scale_job.make_job(n, m, tp, args.seed)
    print(f"job: {n} ranks, tensor-parallel groups of {tp}, data-parallel groups of {job.dp}; "
          f"{m} collectives per rank (+{job.group_calls} group-creation calls); culprit rank "
          f"{job.culprit} skips the broadcast #{job.hang_seq} of group 0 (calls all_reduce)",
          flush=True)

    capture = root / "capture"
    t0 = time.perf_counter()
    reused = _written(ap, "capture", capture, job, args)
    gen = time.perf_counter() - t0
    used, apparent = scale_job.disk_usage(capture)
    print(f"captures: {n} files{' in per-host directories' if args.per_node else ''}, "
          f"{_mib(used)} on disk ({_mib(apparent)} apparent, sparse), "
          f"{'reused' if reused else f'written in {gen:.1f} s'} ({capture})", flush=True)

    report = root / "report.json"
    limit = None if args.memory_limit is None else args.memory_limit * (1 << 30)
    doctor = shlex.split(args.doctor) if args.doctor else _tool("nccl-doctor", "nccl_doctor")
    dr = timed(doctor + ["replay", str(capture), "--format", "json", "-o", str(report),
                         "--force"], args.replay_timeout, root / "replay.log", limit)
    print(f"nccl-doctor replay  {dr.seconds:8.2f} s  peak {dr.peak_mib:6.0f} MiB "
          f"(tree {dr.tree_mib:6.0f} MiB)  {dr.state()}", flush=True)
    failed = dr.rc != 0
    if not failed:
        blamed, named = doctor_culprit(report)
        failed = _verdict(blamed, job.culprit) != "ok"
        print(f"  culprit: {named}; injected rank {job.culprit}: "
              f"{_verdict(blamed, job.culprit)}", flush=True)
    worst = max(dr.peak_mib, dr.tree_mib)
    print(f"  replay peak memory {worst:.0f} MiB (goal <= {GOAL_MIB} MiB): "
          f"{'ok' if worst <= GOAL_MIB else 'OVER'}", flush=True)
    if (n, m) == (1024, 10000):
        print(f"  replay time {dr.seconds:.2f} s (goal <= {GOAL_S:.0f} s): "
              f"{'ok' if dr.seconds <= GOAL_S else 'OVER'}", flush=True)

    ft_s = math.nan
    if not args.skip_torchfrtrace:
        dumps = root / "fr_dumps"
        t0 = time.perf_counter()
        reused = _written(ap, "dumps", dumps, job, args)
        gen = time.perf_counter() - t0
        print(f"dumps: {n} Flight Recorder pickles, {_mib(scale_job.disk_usage(dumps)[0])}, "
              f"{'reused' if reused else f'written in {gen:.1f} s'} ({dumps})", flush=True)
        frtrace = _tool("torchfrtrace", "torch.distributed.flight_recorder.fr_trace")
        ft = timed(frtrace + [str(dumps), "--prefix", "rank_"], args.torchfrtrace_timeout,
                   root / "torchfrtrace.log", limit)
        ft_s = ft.seconds
        print(f"torchfrtrace        {ft.seconds:8.2f} s  peak {ft.peak_mib:6.0f} MiB "
              f"(tree {ft.tree_mib:6.0f} MiB)  {ft.state()}", flush=True)
        if ft.rc == 0:
            blamed, named = torchfrtrace_culprit(ft.output)
            print(f"  culprit: {named}; injected rank {job.culprit}: "
                  f"{_verdict(blamed, job.culprit)}", flush=True)
        if dr.rc == 0 and ft.rc in (0, None):
            print(f"ratio: {'>' if ft.rc is None else ''}{ft.seconds / dr.seconds:.1f}x "
                  "(goal >= 20x at 1,024 ranks x 10,000 collectives)", flush=True)
    if args.keep is not None:
        print(f"captures, dumps, report and logs kept under {root}")
    line = (f"replay_scale ranks={n} collectives={m} replay_s={dr.seconds:.2f} "
            f"replay_mib={max(dr.peak_mib, dr.tree_mib):.0f} torchfrtrace_s={ft_s:.2f}")
    print(line)
    if not failed:
        record(line)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
