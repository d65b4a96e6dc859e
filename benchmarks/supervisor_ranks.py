"""What the supervisor costs per local rank: CPU per minute of wait and per 1,000 collectives,
at 4, 16 and 64 ranks on one host (issue 52: <= 1% of a core at 64 local ranks waiting).

64 real gloo ranks do not fit two cores and 24 GiB, so the ranks here are *fake*: processes
forked by a launcher that imports no torch. Each writes its capture with the recorder's own
writer (capture/writer.py: the same ring, header and counters the supervisor follows), under
``nccl-doctor run`` as a real job is. How they differ from real ranks: no torch, no gloo, no
in-rank agent (the watchdog's questions to it go unanswered, as for a rank stuck in C++), one
process per rank (no threads), and their calls are written at a set pace rather than made.

Two phases, the supervisor's own CPU (psutil: user + system, its threads, not its children)
measured over each:

- **wait**: every rank has written ``--calls`` collectives; then rank 0 computes (busy in
  Python, outside any collective) for ``--pause`` s while the others wait inside the next
  all_reduce - a healthy pause (the job must end with exit status 0 and verdict ok).
- **calls**: then every rank writes a collective every ``--every`` s for ``--calls-s`` s; the
  supervisor's CPU over that span per 1,000 collectives written (all ranks together).

    python benchmarks/supervisor_ranks.py [--ranks 4 16 64] [--pause 30] [--calls-s 15]

The last line is ``supervisor_ranks ranks=R wait=P% per_1000_calls=S`` for the largest R.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _results import record  # noqa: E402

JOB = r"""
import os, re, sys, time
from pathlib import Path
from nccl_doctor import env
from nccl_doctor.capture import format as fmt
from nccl_doctor.capture.writer import CaptureWriter
from nccl_doctor.model import EventKind, EventState

n, calls, pause, calls_s, every, work = (int(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3]),
                                         float(sys.argv[4]), float(sys.argv[5]), Path(sys.argv[6]))
out = Path(os.environ[env.CAPTURE_DIR])
host = env.host_name()


def mark(path):  # the time now in ``path``, whole when it appears (never read half written)
    part = path.with_suffix(".part")
    part.write_text(str(time.time()))
    os.rename(part, path)


def rank_main(rank):
    pid = os.getpid()
    meta = {"rank": rank, "world_size": n, "host": host, "pid": pid, "local_rank": rank,
            "node_rank": 0, "started_ns": time.time_ns(),
            "run_id": os.environ.get(env.RUN_ID, ""), "argv": ["fake_rank"]}
    safe = re.sub(r"[^A-Za-z0-9_-]", "_", host)[:64]
    w = CaptureWriter(out / f"rank{rank:05d}.{safe}.{pid}{fmt.CAPTURE_SUFFIX}", meta)
    op, group, inp = w.intern("all_reduce"), w.intern("0"), w.intern("float32[4]")
    path, fn = w.intern(str(work / "train.py")), w.intern("step")

    def call(seq, end=True):
        idx = w.begin((0, time.time_ns(), seq, 16, 7, op, group, inp, 0, path, 40, fn, path, 40,
                       0, -1, n, 0, int(EventKind.COLLECTIVE), 0, 0))
        if end:
            w.end(idx, int(EventState.RETURNED), 1)
        return idx

    for seq in range(1, calls + 1):
        call(seq)
    (work / f"ready{rank}").touch()
    while len(list(work.glob("ready*"))) < n:  # every rank filled: the pause begins together
        time.sleep(0.05)
    seq = calls + 1
    if rank == 0:
        mark(work / "paused")
        end, x = time.time() + pause, 0
        while time.time() < end:  # an evaluation: busy in Python, no collective
            x += sum(range(1000))
        call(seq)
    else:
        idx = call(seq, end=False)  # waiting inside the all_reduce for rank 0
        while not (work / "paused").exists():
            time.sleep(0.05)
        time.sleep(max(0.0, float((work / "paused").read_text()) + pause - time.time()))
        w.end(idx, int(EventState.RETURNED), 1)
    if rank == 0:
        mark(work / "calling")
    # collectives again, as many on every rank, on one schedule (the k-th at the same time on
    # every rank, as a real collective's peers meet), so that no rank drifts behind the others
    t0 = float((work / "paused").read_text()) + pause
    for k in range(int((calls_s + 0.5) / every)):
        seq += 1
        time.sleep(max(0.0, t0 + k * every - time.time()))
        call(seq)
    w.note("destroyed")  # (what the recorder notes at destroy_process_group and at exit)
    w.note("exit")
    w.close()


children = []
for rank in range(n):
    pid = os.fork()
    if pid == 0:
        try:
            rank_main(rank)
        finally:
            os._exit(0)
    children.append(pid)
status = 0
for pid in children:
    _, code = os.waitpid(pid, 0)
    status = status or code
sys.exit(1 if status else 0)
"""


def cpu(proc: psutil.Process) -> float:
    t = proc.cpu_times()
    return t.user + t.system


def started(out: Path) -> int:
    """The records every rank's capture header counts, together."""
    from nccl_doctor.capture.names import capture_files
    from nccl_doctor.capture.reader import read_counters

    return sum(read_counters(p)[1] for p in capture_files(out))


def until(path: Path, proc: subprocess.Popen, what: str) -> None:
    while not path.exists():
        if proc.poll() is not None:
            raise SystemExit(f"the job ended before {what}: {proc.stderr.read()[-2000:]}")
        time.sleep(0.05)


def measure(ranks: int, calls: int, pause: float, calls_s: float, every: float,
            settle: float) -> dict:
    work = Path(tempfile.mkdtemp(prefix="ncd-ranks-"))
    try:
        job, out = work / "job.py", work / "out"
        job.write_text(JOB)
        doctor = Path(sys.executable).with_name("nccl-doctor")
        command = [str(doctor), "run", "--quiet", "--out", str(out), "--", sys.executable,
                   str(job), str(ranks), str(calls), str(pause), str(calls_s), str(every),
                   str(work)]
        proc = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                                text=True)
        supervisor = psutil.Process(proc.pid)
        until(work / "paused", proc, "its pause")
        time.sleep(settle)  # the watchdog notices the quiet and starts looking
        own0, t0 = cpu(supervisor), time.monotonic()
        time.sleep(max(1.0, pause - settle - 1.5))
        wait = (cpu(supervisor) - own0) / (time.monotonic() - t0)
        until(work / "calling", proc, "its calls")
        time.sleep(0.5)
        own0, t0, n0 = cpu(supervisor), time.monotonic(), started(out)
        time.sleep(max(1.0, calls_s - 1.0))
        span = time.monotonic() - t0
        spent = cpu(supervisor) - own0
        written = max(1, started(out) - n0)  # (the records the ranks' headers count)
        _, err = proc.communicate(timeout=pause + calls_s + 300)
        if not (out / "report.json").is_file():
            raise SystemExit(f"{ranks} ranks: the run (exit {proc.returncode}) wrote no report: "
                             f"{err[-2000:]}")
        report = json.loads((out / "report.json").read_text())
        said = [f"{f.get('kind')}: {f.get('title')}" for f in report.get("findings", [])][:3]
        return {"ranks": ranks, "status": proc.returncode, "verdict": report.get("verdict"),
                "said": said, "wait": wait, "per_1000": spent / written * 1000,
                "calls_per_s": written / span, "stderr": err[-500:]}
    finally:
        shutil.rmtree(work, ignore_errors=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", type=int, nargs="+", default=[4, 16, 64])
    parser.add_argument("--calls", type=int, default=2_000,
                        help="collectives each rank writes before the pause (default 2,000)")
    parser.add_argument("--pause", type=float, default=30.0)
    parser.add_argument("--calls-s", type=float, default=15.0)
    parser.add_argument("--every", type=float, default=0.02,
                        help="a rank's pace while calling: one collective every S s")
    parser.add_argument("--settle", type=float, default=5.0)
    args = parser.parse_args()
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    print(f"{'ranks':>5} {'wait: a core':>12} {'per 1,000 calls':>16} {'calls/s':>8}  job")
    last = None
    for ranks in args.ranks:
        r = measure(ranks, args.calls, args.pause, args.calls_s, args.every, args.settle)
        ok = r["status"] == 0 and r["verdict"] == "ok"
        print(f"{ranks:>5} {r['wait']:>12.2%} {r['per_1000'] * 1e3:>13.1f} ms "
              f"{r['calls_per_s']:>8.0f}  exit {r['status']}, verdict {r['verdict']}"
              + ("" if ok else f"  NOT A HEALTHY RUN: {r['said']} {r['stderr']!r}"))
        last = r
    if last is not None:
        line = (f"supervisor_ranks ranks={last['ranks']} wait={last['wait']:.2%} "
                f"per_1000_calls={last['per_1000'] * 1e3:.1f}ms")
        print(f"{line} (goal: wait <= 1% at 64 ranks)")
        record(line)


if __name__ == "__main__":
    main()
