"""What ``nccl-doctor run`` adds at the edges of a run: a trivial 2-rank job, bare and under it.

The job does nothing but start: each rank initialises a gloo process group, runs one
all_reduce and exits, launched by ``python -m torch.distributed.run --nproc-per-node 2``
(torchrun). Whatever ``nccl-doctor run`` adds to it is its own start (importing the CLI, the
supervisor's setup, the ranks' bootstrap) and its own end (the post mortem, report.json,
report.html, the console report): the job has no middle to watch.

Each pair runs the bare launcher and the same launcher under ``nccl-doctor run --out DIR``
(a fresh directory each time, the console report printed to a pipe as a terminal would get it),
back to back, in alternating order, so that the machine's drift cancels in the paired
differences; ``--versions`` compares source trees of nccl-doctor the same way, in one run. Wall
time: from the launch to the reaped exit (``time.perf_counter``). CPU: user + system of the
child and every descendant it reaped (``os.wait4``: the launcher's ranks, the supervisor's
launcher and reaper); every run must exit 0. Printed per pair, then the medians and the medians
of the paired differences.

    python benchmarks/run_edges.py [--pairs 8] [--ranks 2] [--quiet] [--no-gpu] [--no-bytecode]
                                   [--versions DIR...]

Python's bytecode: the children write and reuse it (``PYTHONPYCACHEPREFIX``: a directory kept
in the system's temporary directory across runs, filled by the first, slow, unmeasured run), as
an installed package has its ``.pyc`` files; ``--no-bytecode`` runs them with
``PYTHONDONTWRITEBYTECODE=1``, where every process compiles the project's modules from source
(a checkout whose environment sets it).

Goals (issue 52; issue 42's was 0.3 s of wall time): <= 0.1 s of added wall time, <= 0.2 s of
added CPU. The last line is (with ``--versions``, one such
line per version, ending in ``version=NAME``)

  run_edges bare_s=B run_s=R added_wall_s=W added_cpu_s=C ratio=X goal_ratio=G
"""

from __future__ import annotations

import argparse
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _results import record  # noqa: E402

GOAL_S, GOAL_CPU_S = 0.1, 0.2  # issue 52 (issue 42's goal was 0.3 s of wall time)

JOB = r"""
import torch, torch.distributed as dist
dist.init_process_group("gloo")
t = torch.ones(4)
dist.all_reduce(t)
dist.destroy_process_group()
"""


@dataclass(frozen=True)
class Timed:
    wall: float
    cpu: float  # user + system, the reaped descendants included


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def timed(command: list[str], env: dict[str, str], cwd: Path) -> Timed:
    """One child, to its reaped exit: wall and CPU (its own and its reaped descendants')."""
    t0 = time.perf_counter()
    child = subprocess.Popen(command, env=env, cwd=cwd, stdout=subprocess.DEVNULL,
                             stderr=subprocess.PIPE)
    err = child.stderr.read()  # a pipe, read as a terminal would be (the console report)
    _, status, usage = os.wait4(child.pid, 0)
    wall = time.perf_counter() - t0
    child.returncode = os.waitstatus_to_exitcode(status)  # reaped: keep Popen quiet
    child.stderr.close()
    if child.returncode != 0:
        raise SystemExit(f"{command[0]} ... exited {child.returncode}:\n"
                         f"{err.decode(errors='replace')[-2000:]}")
    return Timed(wall, usage.ru_utime + usage.ru_stime)


def launcher(job: Path, ranks: int) -> list[str]:
    return [sys.executable, "-m", "torch.distributed.run", "--nnodes", "1",
            "--nproc-per-node", str(ranks), "--master-port", str(free_port()), str(job)]


def doctored(command: list[str], work: Path, extra: list[str]) -> list[str]:
    """``nccl-doctor run`` as ``python -m nccl_doctor``, which runs what the console script
    runs and is found on PYTHONPATH: a tree given to --versions whose console script's entry
    point differs from the installed one's still runs."""
    out = Path(tempfile.mkdtemp(prefix="out-", dir=work))
    return [sys.executable, "-m", "nccl_doctor", "run", *extra, "--out", str(out), "--", *command]


def median(values: list[float]) -> float:
    return statistics.median(values)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pairs", type=int, default=8)
    parser.add_argument("--ranks", type=int, default=2)
    parser.add_argument("--quiet", action="store_true",
                        help="run --quiet (no live status, no console report)")
    parser.add_argument("--no-gpu", action="store_true", help="run --no-gpu")
    parser.add_argument("--no-bytecode", action="store_true",
                        help="no .pyc written or read for the project's modules: compiled from "
                             "source in every process")
    parser.add_argument("--versions", nargs="+", type=Path, default=None, metavar="DIR",
                        help="compare versions of nccl-doctor in one run: each DIR holds an "
                             "nccl_doctor package (e.g. a `git archive` of a commit), put first "
                             "on PYTHONPATH for its runs; each pair becomes a round of the bare "
                             "launcher and every version, in rotating order")
    args = parser.parse_args()
    extra = [flag for flag, on in (("--quiet", args.quiet), ("--no-gpu", args.no_gpu)) if on]
    env = dict(os.environ, OMP_NUM_THREADS="1")
    env.pop("NCCL_DOCTOR_DIR", None)
    if args.no_bytecode:
        env["PYTHONDONTWRITEBYTECODE"] = "1"
    else:
        env.pop("PYTHONDONTWRITEBYTECODE", None)
        env["PYTHONPYCACHEPREFIX"] = str(Path(tempfile.gettempdir()) / "ncd-edges-pycache")
    sides: dict[str, dict[str, str]] = {"bare": env}
    for version in args.versions or ():
        path = [str(version.absolute())] + [p for p in [env.get("PYTHONPATH")] if p]
        sides[version.name] = dict(env, PYTHONPATH=os.pathsep.join(path))
    if len(sides) == 1:
        sides["run"] = env
    names = list(sides)
    with tempfile.TemporaryDirectory(prefix="ncd-edges-") as tmp:
        work = Path(tmp)
        job = work / "job.py"
        job.write_text(JOB)

        def once(name: str) -> Timed:
            command = launcher(job, args.ranks)
            # (run in the scratch directory: ``python -m`` puts the working directory first
            # on sys.path, where a checkout's nccl_doctor would shadow the version's)
            return timed(command if name == "bare" else doctored(command, work, extra),
                         sides[name], work)

        for name in names:  # unmeasured: the page cache (and the bytecode) hold everything after
            once(name)
        print(f"{'pair':>4} " + " ".join(f"{n[:10] + ' wall':>15} {'cpu':>5}" for n in names))
        got: dict[str, list[Timed]] = {n: [] for n in names}
        for i in range(args.pairs):
            order = names[i % len(names):] + names[:i % len(names)]  # each goes first in turn
            for name in order:
                got[name].append(once(name))
            print(f"{i + 1:>4} " + " ".join(f"{got[n][-1].wall:>15.2f} {got[n][-1].cpu:>5.2f}"
                                            for n in names), flush=True)
    bare = got["bare"]
    bare_wall = median([t.wall for t in bare])
    print(f"\nmedians over {args.pairs} rounds ({args.ranks} ranks"
          + (f", run {' '.join(extra)}" if extra else "")
          + (", no bytecode" if args.no_bytecode else "") + f"): bare launcher "
          f"{bare_wall:.2f} s wall, {median([t.cpu for t in bare]):.2f} s CPU")
    summary = ""
    for name in names[1:]:
        under = got[name]
        run_wall = median([t.wall for t in under])
        added_wall = median([r.wall - b.wall for b, r in zip(bare, under)])
        added_cpu = median([r.cpu - b.cpu for b, r in zip(bare, under)])
        verdict = ("met" if added_wall <= GOAL_S and added_cpu <= GOAL_CPU_S else
                   f"NOT met ({added_wall / GOAL_S:.1f}x, {added_cpu / GOAL_CPU_S:.1f}x)")
        print(f"  {name}: {run_wall:.2f} s wall, {median([t.cpu for t in under]):.2f} s CPU; "
              f"added (paired) {added_wall:+.2f} s wall, {added_cpu:+.2f} s CPU; ratio "
              f"{run_wall / bare_wall:.2f}; goals <= {GOAL_S} s added wall, <= {GOAL_CPU_S} s added CPU: "
              f"{verdict}")
        summary = (f"run_edges bare_s={bare_wall:.3f} run_s={run_wall:.3f} "
                   f"added_wall_s={added_wall:.3f} added_cpu_s={added_cpu:.3f} "
                   f"ratio={run_wall / bare_wall:.3f} goal_ratio={added_wall / GOAL_S:.2f}")
        if len(names) > 2:
            print(f"  {summary} version={name}")
    if len(names) == 2:
        print(f"\n{summary}")
        record(summary)


if __name__ == "__main__":
    main()
