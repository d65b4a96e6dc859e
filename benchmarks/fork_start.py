"""What a 2-rank ``@pytest.mark.distributed`` test costs with its ranks forked by the fork server
(nccl_doctor/testing/zygote.py) and started fresh (``NCCL_DOCTOR_FORK_SERVER=0``: each rank a
new Python that imports torch), measured as pairs: each round runs pytest on the same test file
both ways, one right after the other, so that a busy machine weighs on both alike.

Per test: the wall time is pytest's own for each test (set-up, call, tear-down, from its JUnit
XML), the median over the tests of a K-test file but its first (which may wait for the fork
server to finish importing torch: once per session). The CPU is what one more test costs: pytest
runs a file of 1 test and a file of K, and (CPU(K) - CPU(1)) / (K - 1) counts every process -
pytest, the supervisor's helpers, the ranks, the fork server (RUSAGE_CHILDREN of a process that
waited for them all) - without pytest's start or the server's. The bare test body is the time the test
function itself took on its ranks (the slowest rank's, from the test's first line to its last):
the added wall time is a test's cost less its body.

    .venv/bin/python benchmarks/fork_start.py [--tests K] [--rounds R]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from xml.etree import ElementTree

TEST = '''
import json, os, time
import pytest
import torch
import torch.distributed as dist


@pytest.mark.distributed(world_size=2)
def test_{n}():
    started = time.perf_counter()
    t = torch.ones(1024)
    for _ in range(10):
        dist.all_reduce(t)
    dist.barrier()
    assert t[0].item() == 2.0 ** 10
    with open(os.path.join(os.environ["BODY_DIR"], f"{n}.{{dist.get_rank()}}"), "w") as f:
        f.write(json.dumps(time.perf_counter() - started))
'''


def run_pytest(directory: Path, tests: int, fork: bool) -> tuple[float, float, float, float]:
    """(session wall s, CPU s of every process, the median test's wall s but the first's, the
    median test body s: its slowest rank's)."""
    test_file = directory / f"test_k{tests}.py"
    test_file.write_text("".join(TEST.format(n=f"t{i}") for i in range(tests)))
    bodies = directory / f"bodies{tests}{'f' if fork else 's'}"
    bodies.mkdir(exist_ok=True)
    for old in bodies.iterdir():
        old.unlink()
    environ = dict(os.environ, BODY_DIR=str(bodies), NCCL_DOCTOR_FORK_SERVER="1" if fork else "0")
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.perf_counter()
    xml = directory / "junit.xml"
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-n", "0", "-p",
                           "no:cacheprovider", f"--junitxml={xml}", "-o", "junit_duration_report=total",
                           str(test_file)], cwd=directory, env=environ,
                          capture_output=True, text=True)
    wall = time.perf_counter() - started
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if done.returncode != 0:
        raise SystemExit(f"pytest failed ({'fork' if fork else 'spawn'}):\n{done.stdout[-3000:]}")
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    per_test: dict[str, float] = {}
    for path in bodies.iterdir():
        name = path.name.split(".")[0]
        per_test[name] = max(per_test.get(name, 0.0), json.loads(path.read_text()))
    times = [float(case.get("time", "nan"))
             for case in ElementTree.parse(xml).getroot().iter("testcase")]
    test_wall = statistics.median(times[1:] or times)
    return wall, cpu, test_wall, statistics.median(per_test.values())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tests", type=int, default=4, help="K, tests in the longer file")
    parser.add_argument("--rounds", type=int, default=2, help="pairs of runs")
    args = parser.parse_args(argv)
    rows: dict[str, list[tuple[float, float, float]]] = {"spawn": [], "fork": []}
    with tempfile.TemporaryDirectory() as tmp:
        directory = Path(tmp)
        for r in range(args.rounds):
            for mode in ("spawn", "fork"):
                one = run_pytest(directory, 1, mode == "fork")
                many = run_pytest(directory, args.tests, mode == "fork")
                k = args.tests - 1
                wall, cpu, body = many[2], (many[1] - one[1]) / k, many[3]
                rows[mode].append((wall, cpu, body))
                print(f"round {r + 1} {mode:5}: {wall:5.2f} s wall, {cpu:5.2f} s CPU per test; "
                      f"body {body:4.2f} s; session of {args.tests}: {many[0]:5.1f} s wall, "
                      f"{many[1]:5.1f} s CPU", flush=True)
    med = {m: [statistics.median(x[i] for x in v) for i in range(3)] for m, v in rows.items()}
    print(f"\nper 2-rank distributed test (median of {args.rounds} pairs, {os.cpu_count()} CPUs):")
    print(f"{'':7}{'wall s':>8}{'CPU s':>8}{'body s':>8}{'added wall s':>14}")
    for mode in ("spawn", "fork"):
        wall, cpu, body = med[mode]
        print(f"{mode:7}{wall:8.2f}{cpu:8.2f}{body:8.2f}{wall - body:14.2f}")
    print(f"fork/spawn: wall x{med['fork'][0] / med['spawn'][0]:.2f}, "
          f"CPU x{med['fork'][1] / med['spawn'][1]:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
