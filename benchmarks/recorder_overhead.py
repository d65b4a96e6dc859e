"""Recorder overhead: microseconds per small all_reduce on a 1-rank gloo group.

Prints, in one run, the time per call bare, with the nccl-doctor recorder, and with
TORCH_DISTRIBUTED_DEBUG=DETAIL, and the ratios. Budget: the recorder adds at most 3 us per call.

Bare and recorder run in one process, in alternating rounds (the recorder's wrapper swapped in and
out of ``torch.distributed``), so that the machine's drift - gloo's thread hand-off time varies a
lot on a small VM - cancels in the paired differences. DETAIL is read once, at
init_process_group, so it runs in a process of its own, alternating with a bare process.

The recorder writes its records through the C ring (nccl_doctor/capture/_ring.c) when it was
built, else through the pure-Python ring; both are measured (the Python one with
NCCL_DOCTOR_PURE_PYTHON=1) and the budget is judged on the one a default install uses.

    python benchmarks/recorder_overhead.py [--calls 2000] [--rounds 40]
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile

from nccl_doctor.capture.ring import PURE_PYTHON_ENV, accelerated

CHILD = r"""
import json, os, sys, time
mode, calls, rounds = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
if os.environ.get("BENCH_CPU"):  # before torch starts gloo's threads: they inherit it
    os.sched_setaffinity(0, {int(os.environ["BENCH_CPU"])})
if mode == "paired":
    import nccl_doctor
    nccl_doctor.install(os.environ["BENCH_DIR"])
import torch, torch.distributed as dist
dist.init_process_group("gloo", rank=0, world_size=1)
t = torch.zeros(8)
recorded = dist.all_reduce
bare = getattr(recorded, "__wrapped__", recorded) if mode == "paired" else recorded

def timed(fn):
    t0 = time.perf_counter()
    for _ in range(calls):
        fn(t)
    return (time.perf_counter() - t0) / calls * 1e6

for _ in range(3):
    timed(recorded), timed(bare)
out = {"bare": [], "recorder": []}
for _ in range(rounds):
    out["bare"].append(timed(bare))
    if mode == "paired":
        out["recorder"].append(timed(recorded))
dist.destroy_process_group()
print(json.dumps(out))
"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_child(mode: str, calls: int, rounds: int, directory: str, detail: bool,
              pure_python: bool = False, cpu: int | None = None) -> dict:
    env = dict(os.environ, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()),
               BENCH_DIR=directory, NCCL_DOCTOR_RING_RECORDS=os.environ.get("BENCH_RING", "65536"))
    env[PURE_PYTHON_ENV] = "1" if pure_python else "0"
    env.pop("BENCH_CPU", None)
    if cpu is not None:
        env["BENCH_CPU"] = str(cpu)
    env.pop("NCCL_DOCTOR_DIR", None)
    env.pop("TORCH_DISTRIBUTED_DEBUG", None)
    if detail:
        env["TORCH_DISTRIBUTED_DEBUG"] = "DETAIL"
    proc = subprocess.run([sys.executable, "-c", CHILD, mode, str(calls), str(rounds)],
                          env=env, capture_output=True, text=True)
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
    if not lines:  # gloo sometimes aborts at interpreter exit after printing; the data are in
        raise SystemExit(f"benchmark child failed ({proc.returncode}):\n{proc.stderr[-2000:]}")
    return json.loads(lines[-1])


def report(label: str, paired: dict) -> float:
    """Print one recorder line; return the larger of its two estimates of the added time."""
    bare, rec = statistics.median(paired["bare"]), statistics.median(paired["recorder"])
    added = statistics.median(r - b for r, b in zip(paired["recorder"], paired["bare"]))
    print(f"  {label:<32} {rec:8.2f} us/call   ratio {rec / bare:.3f}   adds {rec - bare:.2f} "
          f"us/call (difference of medians), {added:.2f} us/call (median of paired round "
          f"differences; its own bare rounds: {bare:.2f} us/call)")
    return max(added, rec - bare)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=2000, help="calls per timed round")
    parser.add_argument("--rounds", type=int, default=40, help="rounds per configuration")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        default = run_child("paired", args.calls, args.rounds, os.path.join(tmp, "c"), False)
        python = run_child("paired", args.calls, max(args.rounds // 2, 4),
                           os.path.join(tmp, "py"), False, pure_python=True)
        cpu = max(os.sched_getaffinity(0))
        pinned = run_child("paired", args.calls, args.rounds, os.path.join(tmp, "pin"), False,
                           cpu=cpu)
        pinned_py = run_child("paired", args.calls, args.rounds, os.path.join(tmp, "pinpy"),
                              False, pure_python=True, cpu=cpu)
        detail, plain = [], []
        for _ in range(4):  # alternate DETAIL and plain processes against drift
            detail += run_child("single", args.calls, args.rounds // 4, tmp, True)["bare"]
            plain += run_child("single", args.calls, args.rounds // 4, tmp, False)["bare"]
    ring = "C ring" if accelerated() else "Python ring (the C ring is not built)"
    print(f"small all_reduce (8 floats), 1-rank gloo group: {args.rounds} rounds x {args.calls} "
          f"calls, medians")
    bare = statistics.median(default["bare"])
    print(f"  bare                             {bare:8.2f} us/call")
    added_default = report(f"recorder, {ring}", default)
    if accelerated():
        report("recorder, pure-Python ring", python)
    d_med, p_med = statistics.median(detail), statistics.median(plain)
    print(f"  TORCH_DISTRIBUTED_DEBUG=DETAIL   {d_med:8.2f} us/call   "
          f"ratio {d_med / p_med:.3f}   adds {d_med - p_med:.2f} us/call (vs bare processes "
          f"alternated with it: {p_med:.2f} us/call)")
    print(f"the same, the process pinned to CPU {cpu} (gloo's worker thread then shares the "
          f"caller's CPU: no cross-CPU wake-up, and far less noise)")
    print(f"  bare                             {statistics.median(pinned['bare']):8.2f} us/call")
    added_pinned = report(f"recorder, {ring}", pinned)
    if accelerated():
        report("recorder, pure-Python ring", pinned_py)
    worst = max(added_default, added_pinned)
    print(f"recorder budget 3.00 us/call, default install ({ring}): "
          f"{'met' if worst <= 3.0 else 'EXCEEDED'} (largest estimate {worst:.2f} us/call; "
          f"pinned {added_pinned:.2f}, unpinned {added_default:.2f})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
