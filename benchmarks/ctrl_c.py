"""Time from the user's Ctrl-C to the end of ``nccl-doctor run --serve 0`` (issue 54: within
2 s): a SIGINT to the doctor's process group, as a terminal sends it, while rank 0 of two waits
in an all_reduce for rank 1 (tests/integration/jobs/train_loop.py, rank 1 slow). Two launches:
``torchrun`` (which ends its workers on the SIGINT itself) and ``shell`` (two ranks a bash
starts: rank 0, blocked in gloo, never sees its KeyboardInterrupt; the doctor kills it a second
later). ``--presses 2``: a second Ctrl-C 0.1 s after the first. Prints every run, the median,
and its ratio to the goal.

    python benchmarks/ctrl_c.py [--runs 5] [--launch torchrun|shell] [--presses 1|2]
"""

from __future__ import annotations

import argparse
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from nccl_doctor.reproducers.nodes import free_port

JOB = Path(__file__).parent.parent / "tests" / "integration" / "jobs" / "train_loop.py"
GOAL_S = 2.0
SLOW = {"STEPS": "100000", "PAUSE": "0.05", "SLOW_RANK": "1", "SLOW_SECONDS": "600"}


def command(launch: str) -> list[str]:
    if launch == "torchrun":
        return [sys.executable, "-m", "torch.distributed.run", "--standalone",
                "--nproc-per-node=2", str(JOB)]
    start = " & ".join(f"RANK={r} {sys.executable} {JOB}" for r in (0, 1))
    return ["bash", "-c", f"export MASTER_ADDR=127.0.0.1 MASTER_PORT={free_port()} "
            f"WORLD_SIZE=2; {start} & wait"]


def one_run(launch: str, presses: int, out: Path) -> float:
    proc = subprocess.Popen([sys.executable, "-m", "nccl_doctor", "run", "--serve", "0",
                             "--hang-after", "600", "--stuck-after", "600", "--out", str(out),
                             "--", *command(launch)], env={**os.environ, **SLOW},
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True)
    deadline = time.monotonic() + 120
    while len(list(out.glob("rank*.ndcap"))) < 2:  # the ranks joined; rank 0 soon waits
        if time.monotonic() > deadline or proc.poll() is not None:
            proc.kill()
            raise SystemExit(f"the ranks did not start ({out})")
        time.sleep(0.1)
    time.sleep(2.0)
    pressed = time.monotonic()
    for n in range(presses):
        os.killpg(proc.pid, signal.SIGINT)
        if n + 1 < presses:
            time.sleep(0.1)
    proc.wait(timeout=120)
    return time.monotonic() - pressed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--launch", choices=("torchrun", "shell"), default="shell")
    parser.add_argument("--presses", type=int, choices=(1, 2), default=1)
    args = parser.parse_args()
    times = []
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(args.runs):
            took = one_run(args.launch, args.presses, Path(tmp) / f"run{i}")
            times.append(took)
            print(f"run {i + 1}: Ctrl-C to the command's end {took:.2f} s", flush=True)
    median = statistics.median(times)
    print(f"ctrl-c ({args.launch}, {args.presses} press{'es' if args.presses > 1 else ''}): "
          f"median {median:.2f} s over {args.runs} runs (goal <= {GOAL_S:.0f} s: "
          f"{median / GOAL_S:.2f} of it)")


if __name__ == "__main__":
    main()
