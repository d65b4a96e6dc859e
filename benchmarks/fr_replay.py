"""Reading PyTorch Flight Recorder dumps: ``nccl-doctor replay`` against PyTorch's ``torchfrtrace``.

For each size, writes one synthetic NCCL Flight Recorder dump per rank (``rank_<R>``, a protocol-2
pickle shaped like a torch 2.10 dump: version "2.10", pg_config, pg_status, entries) into a
directory, then times, as subprocesses on that same directory, wall clock and peak RSS:

  torchfrtrace DIR --prefix rank_
  nccl-doctor replay DIR --format json -o OUT.json --force

The job in the dumps: N ranks in the default group, a ring buffer of ``--entries`` entries per rank
that has wrapped (record ids do not start at 0), an FSDP-like mix of all_gather / reduce_scatter /
all_reduce with 5-6 frame stacks through user files, all completed but the tail. One rank (N // 3)
skips a broadcast near the end, so from there its all_reduce meets the others' broadcast: both
tools have a real culprit to name, and the table shows the one each names (torchfrtrace: its
"Culprit rank" / "missing ranks" lines; nccl-doctor: the root-cause finding of its JSON report).
A tool that exits non-zero is reported as such (with its last line of output), not raised; a
torchfrtrace run past ``--torchfrtrace-timeout`` is killed and the ratio is a lower bound.
Goal: nccl-doctor at least 20x faster than torchfrtrace at 1,024 ranks.

    python benchmarks/fr_replay.py [--sizes 64,256,1024] [--entries 2000] [--repeat 1]
        [--skip-torchfrtrace] [--torchfrtrace-timeout 1800] [--keep DIR]
"""

from __future__ import annotations

import argparse
import json
import pickle
import random
import re
import shutil
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _child import Run, timed  # noqa: E402

# ---------------------------------------------------------------------------------------------
# Synthetic dumps
# ---------------------------------------------------------------------------------------------

C10D = "/opt/torch/.venv/lib/python3.12/site-packages/torch/distributed/distributed_c10d.py"
LOGGER = "/opt/torch/.venv/lib/python3.12/site-packages/torch/distributed/c10d_logger.py"
FSDP = "/srv/jobs/pretrain/llm/fsdp_lite.py"
MODEL = "/srv/jobs/pretrain/llm/model.py"
TRAIN = "/srv/jobs/pretrain/train.py"
LAYERS = 8  # transformer blocks, one all_gather (forward), all_gather + reduce_scatter (backward)
TAIL = 3  # entries the others enqueue after the broadcast the culprit skips (all "scheduled")


def _frame(name: str, filename: str, line: int) -> dict:
    return {"name": name, "filename": filename, "line": line}


# Frame dicts and strings are shared between entries, as torch's C++ pickler memoizes them (a real
# dump stores each frame once and refers back to it); sizes and dtypes lists are fresh per entry.
# Innermost frame first, as Flight Recorder records them; backward ones start in autograd hooks.
_WRAPPER = _frame("wrapper", LOGGER, 83)
_STEP = _frame("train_step", TRAIN, 142)
_MAIN = _frame("main", TRAIN, 231)
_UNSHARD = _frame("_unshard", FSDP, 58)
STACKS = {
    **{("fwd_gather", i): [_frame("all_gather", C10D, 3934), _WRAPPER, _UNSHARD,
                           _frame("forward", MODEL, 96 + 20 * i), _STEP, _MAIN]
       for i in range(LAYERS)},
    ("bwd_gather", 0): [_frame("all_gather", C10D, 3934), _WRAPPER, _UNSHARD,
                        _frame("_pre_backward", FSDP, 101)],
    ("bwd_scatter", 0): [_frame("reduce_scatter", C10D, 4451), _WRAPPER,
                         _frame("_reduce_grad", FSDP, 127), _frame("_post_backward", FSDP, 119)],
    ("grad_norm", 0): [_frame("all_reduce", C10D, 3068), _WRAPPER,
                       _frame("clip_grad_norm", FSDP, 176), _STEP, _MAIN],
    ("loss", 0): [_frame("all_reduce", C10D, 3068), _WRAPPER, _frame("reduce_loss", TRAIN, 88),
                  _STEP, _MAIN],
    ("sync_config", 0): [_frame("broadcast", C10D, 2968), _WRAPPER,
                         _frame("sync_config", TRAIN, 57), _STEP, _MAIN],
}


# (op, stack kind, elements per rank (all_gather input / reduce_scatter output / all_reduce),
# dtype) for one training step: 26 collectives.
def _step_program() -> list[tuple]:
    prog = []
    for i in range(LAYERS):
        prog.append(("all_gather", "fwd_gather", i, 1_179_648 + 65_536 * i, "BFloat16"))
    for i in reversed(range(LAYERS)):
        prog.append(("all_gather", "bwd_gather", 0, 1_179_648 + 65_536 * i, "BFloat16"))
        prog.append(("reduce_scatter", "bwd_scatter", 0, 1_179_648 + 65_536 * i, "Float"))
    prog.append(("all_reduce", "grad_norm", 0, 1, "Float"))
    prog.append(("all_reduce", "loss", 0, 1, "Float"))
    return prog


@dataclass
class Job:
    ranks: int
    entries: int
    culprit: int
    skip_seq: int  # collective_seq_id of the broadcast the culprit skips
    program: list  # program[seq - 1] is the collective the others enqueue with that seq id


def make_job(ranks: int, entries: int) -> Job:
    """The collective program every rank runs; the ring buffer wrapped a few times."""
    step = _step_program()
    grad_norm_at = next(i for i, p in enumerate(step) if p[1] == "grad_norm")
    total = 3 * entries + grad_norm_at  # enough steps that the buffer wrapped
    program = [step[i % len(step)] for i in range(total)]
    # the broadcast goes right before a grad-norm all_reduce, TAIL entries before the end
    while not (program[-1 - (TAIL - 1)][1] == "grad_norm"):
        program.append(step[len(program) % len(step)])
    s = len(program) - TAIL  # index of the broadcast
    program.insert(s, ("broadcast", "sync_config", 0, 4096, "Float"))
    return Job(ranks=ranks, entries=entries, culprit=ranks // 3, skip_seq=s + 1, program=program)


def fr_entry(*, frames: list[dict], record_id: int, pg_id: int, group: tuple[str, str],
             thread: tuple[str, str], seq: int, op_id: int, op: str, created: int,
             sizes: tuple[list, list], dtype: str, completed: int | None) -> dict:
    """One Flight Recorder entry of an NCCL collective (version 2.10 fields, timing off: no
    start times); ``completed``: when it was found completed, or None: still "scheduled"."""
    done = completed is not None
    return {
        "frames": list(frames),
        "record_id": record_id,
        "pg_id": pg_id,
        "process_group": group,
        "thread_name": thread[0],
        "thread_id": thread[1],
        "collective_seq_id": seq,
        "p2p_seq_id": 0,
        "op_id": op_id,
        "profiling_name": "nccl:" + op,
        "time_created_ns": created,
        "input_sizes": sizes[0],
        "input_dtypes": [dtype],
        "output_sizes": sizes[1],
        "output_dtypes": [dtype],
        "state": "completed" if done else "scheduled",
        "time_discovered_started_ns": None,
        "time_discovered_completed_ns": completed,
        "retired": done,
        "timeout_ms": 600_000,
        "is_p2p": False,
    }


def rank_dump(job: Job, rank: int, pg_config: dict) -> dict:
    """The dump of one rank: its last ``job.entries`` collectives, the tail from the skip on
    still scheduled (NCCL timing is off, as by default: no "started" state, no start times)."""
    n, s = job.ranks, job.skip_seq
    skipped = rank == job.culprit
    last = len(job.program) - (1 if skipped else 0)  # own collective_seq_id of the last entry
    first = last - job.entries + 1
    rng = random.Random(rank)
    t0 = 1_795_373_000_000_000_000 + rng.randrange(5_000_000)
    thread_id = str(139_700_000_000_000 + 4096 * rank)
    entries = []
    for seq in range(first, last + 1):
        op, kind, layer, numel, dtype = job.program[seq - 1 + (1 if skipped and seq >= s else 0)]
        if op == "all_gather":
            ins, outs = [[numel]], [[numel * n]]
        elif op == "reduce_scatter":
            ins, outs = [[numel * n]], [[numel]]
        else:
            ins, outs = [[numel]], [[numel]]
        done = seq < s
        created = t0 + seq * 1_800_000 + rng.randrange(200_000)
        entries.append(fr_entry(
            frames=STACKS[(kind, layer)], record_id=seq - 1, pg_id=0, group=("0", "default_pg"),
            thread=("python3", thread_id), seq=seq, op_id=seq, op=op, created=created,
            sizes=(ins, outs), dtype=dtype,
            completed=created + 1_500_000 if done else None))
    return {
        "version": "2.10",
        "pg_config": pg_config,
        "comm_lib_version": "2.28.9",
        "pg_status": {"0": {"last_enqueued_collective": last, "last_started_collective": -1,
                            "last_completed_collective": s - 1}},
        "entries": entries,
    }


def write_dumps(directory: Path, job: Job) -> int:
    """Writes rank_0 .. rank_<N-1> into ``directory``; returns their total size in bytes."""
    directory.mkdir(parents=True, exist_ok=True)
    pg_config = {"0": {"name": "0", "desc": "default_pg", "ranks": str(list(range(job.ranks)))}}
    total = 0
    for rank in range(job.ranks):
        path = directory / f"rank_{rank}"
        with open(path, "wb") as f:
            pickle.dump(rank_dump(job, rank, pg_config), f, protocol=2)
        total += path.stat().st_size
    return total


# ---------------------------------------------------------------------------------------------
# Running the tools
# ---------------------------------------------------------------------------------------------

def _tool(name: str, module: str) -> list[str]:
    script = Path(sys.executable).parent / name
    if script.exists():
        return [str(script)]
    found = shutil.which(name)
    return [found] if found else [sys.executable, "-m", module]


def _fmt_ranks(ranks: list[int] | set[int]) -> str:
    r = sorted(ranks)
    return ",".join(map(str, r)) if len(r) <= 4 else f"{','.join(map(str, r[:3]))},..({len(r)})"


def torchfrtrace_culprit(output: str) -> tuple[set[int], str]:
    """The ranks torchfrtrace blames: its "Culprit rank N" lines, else its "missing ranks"."""
    culprits = {int(m) for m in re.findall(r"Culprit rank (\d+)", output)}
    if culprits:
        kinds = sorted(set(re.findall(r"Culprit rank \d+; Error type: (\w+)", output)))
        return culprits, f"rank {_fmt_ranks(culprits)} ({'/'.join(kinds)})"
    missing = re.search(r"missing ranks: \{([\d, ]*)\}", output)
    if missing:
        ranks = {int(x) for x in missing.group(1).split(",") if x.strip()}
        return ranks, f"missing ranks {_fmt_ranks(ranks)}"
    return set(), "none named"


def doctor_culprit(report_path: Path) -> tuple[set[int], str]:
    """The first root-cause finding of nccl-doctor's JSON report: its ranks, kind, callsite."""
    try:
        report = json.loads(report_path.read_text())
    except (OSError, ValueError) as e:
        return set(), f"no report ({type(e).__name__})"
    root = [f for f in report.get("findings", []) if f.get("root_cause")]
    if not root:
        return set(), "no root cause"
    f = root[0]
    ranks = set(f.get("ranks") or [])
    return ranks, f"rank {_fmt_ranks(ranks)} {f.get('kind')} @ {f.get('callsite')}"


def repeated(command: list[str], repeat: int, timeout: float | None, log: Path) -> Run:
    """Median over ``repeat`` runs; stops at the first failure or timeout and returns it."""
    runs = []
    for _ in range(repeat):
        run = timed(command, timeout, log)
        if not run.ok:
            return run
        runs.append(run)
    mid = sorted(runs, key=lambda r: r.seconds)[(len(runs) - 1) // 2]
    return Run(seconds=statistics.median(r.seconds for r in runs), rc=0,
               peak_mib=max(r.peak_mib for r in runs),
               tree_mib=max(r.tree_mib for r in runs), output=mid.output)


def _culprits(job: Job, ft: Run | None, dr: Run, report: Path) -> str:
    """Who each tool blames, flagged [MISSED] where the injected culprit is not among them."""
    if ft is None:
        ft_c = "-"
    elif ft.rc is None:
        ft_c = "timed out"
    elif not ft.ok:
        ft_c = "failed"
    else:
        blamed, ft_c = torchfrtrace_culprit(ft.output)
        ft_c += "" if job.culprit in blamed else " [MISSED]"
    if dr.ok:
        blamed, dr_c = doctor_culprit(report)
        dr_c += "" if job.culprit in blamed else " [MISSED]"
    else:
        dr_c = "failed"
    return f"torchfrtrace: {ft_c}; nccl-doctor: {dr_c}"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="64,256,1024", help="rank counts, comma separated")
    ap.add_argument("--entries", type=int, default=2000, help="Flight Recorder entries per rank")
    ap.add_argument("--repeat", type=int, default=1, help="runs per tool and size (median)")
    ap.add_argument("--skip-torchfrtrace", action="store_true")
    ap.add_argument("--torchfrtrace-timeout", type=float, default=1800.0, metavar="S")
    ap.add_argument("--keep", type=Path, default=None, metavar="DIR",
                    help="write the dumps, reports and logs under DIR and keep them")
    args = ap.parse_args()
    sizes = [int(x) for x in args.sizes.split(",") if x.strip()]
    if args.entries < 30:
        ap.error("--entries must be at least 30 (one training step and the tail)")

    root = args.keep or Path(tempfile.mkdtemp(prefix="fr-replay-bench-"))
    root.mkdir(parents=True, exist_ok=True)
    frtrace = _tool("torchfrtrace", "torch.distributed.flight_recorder.fr_trace")
    doctor = _tool("nccl-doctor", "nccl_doctor")
    rows = []
    try:
        for n in sizes:
            job = make_job(n, args.entries)
            base = root / f"r{n}x{args.entries}"
            dumps = base / "dumps"
            if dumps.exists():
                shutil.rmtree(dumps)
            t0 = time.perf_counter()
            size = write_dumps(dumps, job)
            gen = time.perf_counter() - t0
            print(f"{n} ranks x {args.entries} entries: wrote {size / 1e6:.1f} MB in {gen:.1f} s "
                  f"({dumps}); culprit rank {job.culprit} skips the broadcast at "
                  f"collective_seq_id {job.skip_seq}", flush=True)

            ft = None
            if not args.skip_torchfrtrace:
                ft = repeated(frtrace + [str(dumps), "--prefix", "rank_"], args.repeat,
                              args.torchfrtrace_timeout, base.with_suffix(".torchfrtrace.txt"))
                state = ("timed out" if ft.rc is None else "ok" if ft.ok
                         else f"FAILED exit {ft.rc}: {ft.last_line()[:200]}")
                print(f"  torchfrtrace  {ft.seconds:9.2f} s  peak {ft.peak_mib:7.0f} MB  {state}",
                      flush=True)
            report = base.with_suffix(".doctor.json")
            dr = repeated(doctor + ["replay", str(dumps), "--format", "json", "-o", str(report),
                                    "--force"], args.repeat, None, base.with_suffix(".doctor.txt"))
            state = "ok" if dr.ok else f"FAILED exit {dr.rc}: {dr.last_line()[:200]}"
            print(f"  nccl-doctor   {dr.seconds:9.2f} s  peak {dr.peak_mib:7.0f} MB  {state}",
                  flush=True)
            rows.append((job, size, gen, ft, dr, _culprits(job, ft, dr, report)))
            if args.keep is None:
                shutil.rmtree(dumps)
    finally:
        if args.keep is None:
            shutil.rmtree(root, ignore_errors=True)

    print()
    print(f"{'ranks':>6} {'entries':>7} {'dump MB':>8} {'gen s':>6} {'torchfrtrace s':>14} "
          f"{'MB':>6} {'nccl-doctor s':>13} {'MB':>6} {'ratio':>8}  culprits (injected: rank N//3)")
    for job, size, gen, ft, dr, culprits in rows:
        if ft is None:
            ft_s, ft_mb = "skipped", ""
        elif ft.rc is None:
            ft_s, ft_mb = f"> {ft.seconds:.1f}", f"{ft.peak_mib:.0f}"
        else:
            ft_s = f"{ft.seconds:.2f}" if ft.ok else f"exit {ft.rc}"
            ft_mb = f"{ft.peak_mib:.0f}"
        dr_s = f"{dr.seconds:.2f}" if dr.ok else f"exit {dr.rc}"
        if ft is None or ft.rc not in (0, None) or not dr.ok:
            ratio = "n/a"
        else:
            ratio = f"{'>' if ft.rc is None else ''}{ft.seconds / dr.seconds:.1f}x"
        print(f"{job.ranks:>6} {job.entries:>7} {size / 1e6:>8.1f} {gen:>6.1f} {ft_s:>14} "
              f"{ft_mb:>6} {dr_s:>13} {dr.peak_mib:>6.0f} {ratio:>8}  {culprits}")
    print("goal: nccl-doctor >= 20x faster than torchfrtrace at 1,024 ranks")
    if args.keep:
        print(f"dumps, reports and logs kept under {root}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
