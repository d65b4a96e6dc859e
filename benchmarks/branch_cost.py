"""What finding "the branch on the rank that split the ranks" costs a report.

Two sides' call paths (20 and 13 frames) through the real library files installed beside the
project (transformers' trainer.py and trainer_pt_utils.py, accelerate's accelerator.py and
utils/operations.py, torch's distributed_c10d.py and c10d_logger.py) and a synthetic user
script: rank 0 in the evaluation's gather under the script's ``if self.is_world_process_zero():``,
rank 1 in the training loss's all_gather (``_maybe_log_save_evaluate``). One finding =
``branches`` and ``loops`` of both paths, the digests checked, as a report does. Cold: a new
``Sources`` each time (each file read, hashed, decoded, its frames' functions found and parsed);
warm: the same ``Sources`` again. The files are in the page cache; torch is not imported (a
process holding torch's objects pays more for each garbage collection, whatever it runs).

    python benchmarks/branch_cost.py [--rounds 30]

A second finding measures following the rank across calls (source/rank_flow.py): torch's
all_reduce and broadcast called from a user script's ``share(t, is_main)``, whose flag is an
argument, set from an attribute, set from a helper's return, read from another helper.

Goal (the task): <= 50 ms per finding, cold, for both. The last line is

  branch_cost cold_ms=C warm_ms=W goal_ratio=R full_parse_ms=P interproc_cold_ms=I
  interproc_goal_ratio=Q
"""

from __future__ import annotations

import argparse
import ast
import importlib.util
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

from nccl_doctor.source.branch import branches, loops
from nccl_doctor.source.source_text import Sources, digest
from nccl_doctor.location import Location

GOAL_MS = 50.0

USER_SCRIPT = '''\
import os

import torch.distributed as dist
from transformers import Trainer


class EvalTrainer(Trainer):
    def evaluate(self, *args, **kwargs):
        if self.is_world_process_zero():
            return super().evaluate(*args, **kwargs)
        return {}


def build(args):
    trainer = EvalTrainer(model=args.model, args=args.training)
    return trainer


def main(args):
    rank = int(os.environ["RANK"])
    is_master = rank == 0
    trainer = build(args)
    for epoch in range(args.epochs):
        if not is_master and epoch == 0:
            continue
        trainer.train()
    if is_master:
        trainer.save_model()


if __name__ == "__main__":
    main(parse())
'''


# The interprocedural case (source/rank_flow.py): the branch's test reads the rank only
# through a parameter, whose argument is an attribute, set in __init__ from a helper's return,
# which reads another helper's: each link followed to find `if is_main:`. The script is padded
# with ordinary functions to a training script's size (the helpers are found by a text search
# of the whole file).
INTERPROC_SCRIPT = '''\
import os

import torch
import torch.distributed as dist


def rank_of():
    return int(os.environ["RANK"])


def is_main():
    return rank_of() == 0


def share(t, is_main):
    if is_main:
        dist.all_reduce(t)
    else:
        dist.broadcast(t, src=0)
    return t


class Worker:
    def __init__(self, model):
        self.model = model
        self.leader = is_main()
        self.steps = 0

    def step(self, t):
        self.steps += 1
        loss = compute_loss(self.model, t)
        if not torch.isfinite(loss):
            return None
        return share(t, is_main=self.leader)


def compute_loss(model, t):
    return model(t).sum()


{padding}


def main():
    worker = Worker(torch.nn.Linear(8, 8))
    for step in range(10):
        worker.step(torch.ones(8))


if __name__ == "__main__":
    main()
'''

PAD_FUNCTION = '''\
def helper_{k}(batch, config):
    """An ordinary function of a training script."""
    total = 0
    for item in batch:
        if item is None or config.get("skip_{k}"):
            continue
        total += item * {k}
    if total > config.get("limit", 100):
        total = config["limit"]
    return total
'''


def module_file(name: str) -> str:
    """Where module ``name`` is installed, without importing it (find_spec of a submodule
    would import its packages: torch's 200,000 objects would then slow every garbage
    collection in this process)."""
    top, *rest = name.split(".")
    spec = importlib.util.find_spec(top)
    if spec is None or spec.origin is None:
        raise SystemExit(f"{top} is not installed in this environment")
    path = os.path.join(os.path.dirname(spec.origin), *rest) + ".py"
    if not os.path.isfile(path):
        raise SystemExit(f"{path} is not there: the installed {top} differs")
    return path


def frame(path: str, qualname: str, needle: str) -> Location:
    """A frame at the first line of the function ``qualname`` containing ``needle`` (setup:
    the real lines of the real files, found with a full parse that is not timed)."""
    tree = ast.parse(Path(path).read_text())
    want = [n for n in qualname.split(".") if not n.startswith("<")]
    node: ast.AST = tree
    for name in want:
        node = next(n for n in ast.walk(node)
                    if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))
                    and n.name == name and n is not node)
    lines = Path(path).read_text().split("\n")  # not splitlines(): it splits at U+2028 too
    first, last = getattr(node, "lineno", 1), getattr(node, "end_lineno", len(lines))
    for number in range(first, last + 1):
        if needle in lines[number - 1]:
            return Location(path, number, qualname)
    raise SystemExit(f"{needle!r} not in {qualname} of {path}: the installed version differs")


def paths(user: str) -> tuple[list[Location], list[Location]]:
    c10d = module_file("torch.distributed.distributed_c10d")
    logger = module_file("torch.distributed.c10d_logger")
    ops = module_file("accelerate.utils.operations")
    acc = module_file("accelerate.accelerator")
    trainer = module_file("transformers.trainer")
    pt_utils = module_file("transformers.trainer_pt_utils")
    shared = [  # the evaluation's outer frames
        frame(trainer, "Trainer._run_epoch", "self._maybe_log_save_evaluate("),
        frame(trainer, "Trainer._inner_training_loop", "self._run_epoch("),
        frame(trainer, "Trainer.train", "return inner_training_loop("),
        frame(user, "main", "trainer.train()"),
        frame(user, "<module>", "main(parse())"),
    ]
    evaluating = [
        frame(c10d, "all_gather_single", "work = group.all_gather_single("),
        frame(c10d, "all_gather_into_tensor", "return all_gather_single("),
        frame(logger, "_exception_logger.<locals>.wrapper", "return func(*args, **kwargs)"),
        frame(ops, "_gpu_gather.<locals>._gpu_gather_one", "gather_op(output_tensors, tensor)"),
        frame(ops, "recursively_apply", "return func(data, *args, **kwargs)"),
        frame(ops, "_gpu_gather", "return recursively_apply("),
        frame(ops, "verify_operation.<locals>.wrapper", "return function(*args, **kwargs)"),
        frame(ops, "gather", "return _gpu_gather(tensor)"),
        frame(acc, "Accelerator.gather", "return gather(tensor)"),
        frame(acc, "Accelerator.gather_for_metrics", "data = self.gather(input_data)"),
        frame(trainer, "Trainer.evaluation_loop", "losses = self.gather_function("),
        frame(trainer, "Trainer.evaluate", "output = self.evaluation_loop("),
        frame(user, "EvalTrainer.evaluate", "return super().evaluate("),
        frame(trainer, "Trainer._evaluate", "metrics = self.evaluate("),
        frame(trainer, "Trainer._maybe_log_save_evaluate", "metrics = self._evaluate("),
    ]
    training = [
        frame(c10d, "all_gather", "work = group.allgather("),
        frame(logger, "_exception_logger.<locals>.wrapper", "return func(*args, **kwargs)"),
        frame(pt_utils, "distributed_concat", "dist.all_gather(output_tensors, tensor)"),
        frame(pt_utils, "distributed_concat", "return type(tensor)(distributed_concat("),
        frame(pt_utils, "distributed_concat.<locals>.<genexpr>",
              "return type(tensor)(distributed_concat("),
        frame(pt_utils, "distributed_concat", "return type(tensor)(distributed_concat("),
        frame(pt_utils, "nested_gather", "tensors = distributed_concat(tensors)"),
        frame(trainer, "Trainer._maybe_log_save_evaluate", "nested_gather(tr_loss"),
        frame(trainer, "Trainer._run_epoch", "self._maybe_log_save_evaluate("),
        frame(trainer, "Trainer._inner_training_loop", "self._run_epoch("),
        frame(trainer, "Trainer.train", "return inner_training_loop("),
        frame(user, "main", "trainer.train()"),
        frame(user, "<module>", "main(parse())"),
    ]
    return evaluating + shared, training


def interproc_paths(user: str) -> tuple[list[Location], list[Location]]:
    c10d = module_file("torch.distributed.distributed_c10d")
    logger = module_file("torch.distributed.c10d_logger")
    outer = [frame(user, "Worker.step", "return share("), frame(user, "main", "worker.step("),
             frame(user, "<module>", "main()")]
    reducing = [frame(c10d, "all_reduce", "work = group.allreduce("),
                frame(logger, "_exception_logger.<locals>.wrapper", "return func(*args, **kwargs)"),
                frame(user, "share", "dist.all_reduce(t)")]
    broadcasting = [frame(c10d, "broadcast", "work = group.broadcast("),
                    frame(logger, "_exception_logger.<locals>.wrapper",
                          "return func(*args, **kwargs)"),
                    frame(user, "share", "dist.broadcast(t, src=0)")]
    return reducing + outer, broadcasting + outer


def outer_name(qualname: str) -> str | None:
    """The function whose text branch.py parses for a frame (as branch._make_view does)."""
    parts = qualname.split(".")
    named = parts[:parts.index("<locals>")] if "<locals>" in parts else parts
    return named[-1] if named and named[-1].isidentifier() else None


def finding(sources: Sources, side_a: list[Location], side_b: list[Location]) -> int:
    found_a, skipped_a = branches(side_a, sources)
    found_b, skipped_b = branches(side_b, sources)
    loops(side_a, sources)
    loops(side_b, sources)
    if skipped_a or skipped_b:
        raise SystemExit(f"not analysed: {skipped_a + skipped_b}")
    return len(found_a) + len(found_b)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=30)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        user = os.path.join(tmp, "train.py")
        Path(user).write_text(USER_SCRIPT)
        side_a, side_b = paths(user)
        files = sorted({f.path for f in side_a + side_b})
        digests = {p: digest(Path(p).read_bytes()) for p in files}
        sizes = {p: len(Path(p).read_text().splitlines()) for p in files}
        print(f"paths: {len(side_a)} + {len(side_b)} frames in {len(files)} files:")
        for p in files:
            print(f"  {sizes[p]:6,} lines  {p}")

        cold, reading, locating = [], [], []
        count = 0
        for _ in range(args.rounds):
            t0 = time.perf_counter()
            count = finding(Sources(digests), side_a, side_b)
            cold.append((time.perf_counter() - t0) * 1000)
            # where a cold finding's time goes: reading (read, hash, decode, split), then
            # finding and parsing each frame's function; the rest is the analysis itself
            sources = Sources(digests)
            t0 = time.perf_counter()
            for p in files:
                sources.lines(p)
            t1 = time.perf_counter()
            for f in side_a + side_b:
                sources.region(f.path, f.line, outer_name(f.function))
            t2 = time.perf_counter()
            reading.append((t1 - t0) * 1000)
            locating.append((t2 - t1) * 1000)
        sources = Sources(digests)
        finding(sources, side_a, side_b)
        warm = []
        for _ in range(args.rounds):
            t0 = time.perf_counter()
            finding(sources, side_a, side_b)
            warm.append((time.perf_counter() - t0) * 1000)

        # the alternative the design avoids: parsing each whole file
        t0 = time.perf_counter()
        for p in files:
            ast.parse(Path(p).read_text())
        full = (time.perf_counter() - t0) * 1000

        found, _ = branches(side_a, Sources(digests))
        print(f"branches found: {count} on both sides; side A's:")
        for b in found:
            print(f"  {b.kind:<6} {os.path.basename(b.path)}:{b.line} {b.text[:70]}  {b.names}")
        # the interprocedural case: a new Sources each time, as cold
        script = os.path.join(tmp, "interproc.py")
        padding = "\n\n".join(PAD_FUNCTION.format(k=k) for k in range(40))
        Path(script).write_text(INTERPROC_SCRIPT.format(padding=padding))
        ip_a, ip_b = interproc_paths(script)
        ip_digests = {p: digest(Path(p).read_bytes())
                      for p in {f.path for f in ip_a + ip_b}}
        interproc = []
        for _ in range(args.rounds):
            t0 = time.perf_counter()
            finding(Sources(ip_digests), ip_a, ip_b)
            interproc.append((time.perf_counter() - t0) * 1000)
        found, _ = branches(ip_a, Sources(ip_digests))
        named = [b for b in found if b.names == ("is_main",)]
        if not named:
            raise SystemExit("the interprocedural branch was not found: "
                             f"{[(b.kind, b.line, b.names) for b in found]}")
        print(f"interprocedural: {len(ip_a)} + {len(ip_b)} frames, the script "
              f"{len(Path(script).read_text().splitlines())} lines; found "
              f"{named[0].kind} {named[0].text!r} via:")
        for via in named[0].via:
            print(f"  {via}")
        # the same findings with the following switched off (names read as before it):
        # what following costs, on this machine, in this run
        from nccl_doctor.source import branch as branch_module
        saved = branch_module.resolver_for, branch_module._seeds
        branch_module.resolver_for = lambda *a, **k: None  # type: ignore[assignment]
        branch_module._seeds = lambda *a, **k: {}  # type: ignore[assignment]
        try:
            plain, plain_ip = [], []
            for _ in range(args.rounds):
                t0 = time.perf_counter()
                finding(Sources(digests), side_a, side_b)
                t1 = time.perf_counter()
                finding(Sources(ip_digests), ip_a, ip_b)
                t2 = time.perf_counter()
                plain.append((t1 - t0) * 1000)
                plain_ip.append((t2 - t1) * 1000)
        finally:
            branch_module.resolver_for, branch_module._seeds = saved
    c, w = statistics.median(cold), statistics.median(warm)
    ip = statistics.median(interproc)
    r, loc = statistics.median(reading), statistics.median(locating)
    print(f"cold: median {c:.1f} ms, min {min(cold):.1f}, 90th percentile "
          f"{statistics.quantiles(cold, n=10)[-1]:.1f}, max {max(cold):.1f} ({args.rounds} rounds)")
    print(f"  reading the {len(files)} files {r:.1f} ms, locating and parsing the frames' "
          f"functions {loc:.1f} ms, the analysis {c - r - loc:.1f} ms")
    print(f"warm: median {w:.2f} ms")
    print(f"parsing the {len(files)} whole files instead: {full:.0f} ms")
    print(f"interprocedural cold: median {ip:.1f} ms, 90th percentile "
          f"{statistics.quantiles(interproc, n=10)[-1]:.1f}, max {max(interproc):.1f}")
    print(f"following switched off: the first finding {statistics.median(plain):.1f} ms, the "
          f"interprocedural one {statistics.median(plain_ip):.1f} ms (its branch not found)")
    print(f"branch_cost cold_ms={c:.1f} warm_ms={w:.2f} goal_ratio={c / GOAL_MS:.2f} "
          f"full_parse_ms={full:.0f} interproc_cold_ms={ip:.1f} "
          f"interproc_goal_ratio={ip / GOAL_MS:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
