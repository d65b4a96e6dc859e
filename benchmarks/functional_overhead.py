"""What recording the functional collectives costs (issue 40): microseconds added per call.

One process, a 1-rank gloo job recorded by nccl-doctor, and a 1-rank group of torch's fake
backend (the CPU side of a collective alone: no data moved, no thread hand-off, which is what an
NCCL launch costs the CPU; the recorder reads the gloo group's sequence number for it, so that
torch call is paid too). The calls timed are the functional operators as DTensor, funcol and
compiled graphs issue them: ``torch.ops._c10d_functional.all_reduce`` (the issue) and
``wait_tensor`` on its output (the completion), and the pair.

Rounds alternate between the recording kernels installed (rank/recorder/functional.py) and
taken out, so that the machine's drift cancels in the paired differences; the median difference
per call is what recording adds. The options the recording page weighs are timed the same way:

- ``empty kernel``: a Python kernel at the same dispatch key that only passes the call on - the
  floor of any dispatcher-level hook (boxing the arguments into Python and back);
- ``patched op``: the operator's own ``OpOverload._op`` (the builtin ``OpOverload.__call__``
  calls) replaced by the recorder's C fast path around it - no dispatcher boxing, and no gate:
  what recording costs without the dispatcher, not a mechanism the recorder can use (see the
  recording page);
- ``python wrapper``: ``funcol.all_reduce`` wrapped by a Python function that only calls it - what
  wrapping the functional API in Python costs before it records anything (and it never sees a
  compiled graph, whose calls do not go through funcol);
- ``dispatch mode``: a ``TorchDispatchMode`` that only passes calls on, paid by *every* operator
  of the program (timed here on ``torch.add``), not only by the collectives.

    python benchmarks/functional_overhead.py [--calls 2000] [--rounds 30]

Goal (issue 40): <= 2 us added per functional call. The last line is

  functional_overhead issue_us=I wait_us=W pair_us=P empty_kernel_us=E goal_ratio=R
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import tempfile
from pathlib import Path

GOAL_US = 2.0

CHILD = r"""
import json, os, statistics, sys, time
calls, rounds = int(sys.argv[1]), int(sys.argv[2])
import nccl_doctor
nccl_doctor.install(os.environ["BENCH_DIR"])
import torch, torch.distributed as dist
import torch.distributed._functional_collectives as funcol
import torch.testing._internal.distributed.fake_pg  # registers the "fake" backend
from torch.utils._python_dispatch import TorchDispatchMode
from nccl_doctor.rank import bootstrap
from nccl_doctor.rank.recorder import functional

dist.init_process_group("gloo", rank=0, world_size=1)
fake = dist.new_group([0], backend="fake")
name = fake.group_name
rec = bootstrap._recorder
op = torch.ops._c10d_functional.all_reduce.default
wait = torch.ops._c10d_functional.wait_tensor.default
t = torch.zeros(8)
wait(op(t, "sum", name))  # the recorder learns the group
grec = rec.groups[name]
grec.seq = dist.group.WORLD._get_sequence_number_for_group  # fake groups have none
rec._publish()

def recording(on):
    functional.uninstall()
    if on:
        libs, made = functional.install(rec)
        for call in made:
            call.op_id = rec.writer.intern(call.spec.name)
            if call.fast is not None:
                call.fast.op_id = call.op_id
        rec._publish()

def empty(on):
    functional.uninstall()
    if on:
        after = torch._C._after_ADInplaceOrView_keyset
        lib = torch.library.Library("_c10d_functional", "IMPL")
        functional._INSTALLED.append(lib)
        redispatch = op._handle.redispatch_boxed
        def kernel(keyset, *args, **kwargs):
            return redispatch(keyset & after, *args, **kwargs)
        lib.impl("all_reduce", kernel, "ADInplaceOrView", with_keyset=True)

from nccl_doctor.rank.recorder.specs import Spec
from nccl_doctor.rank.recorder.wrappers import BoundCall, wrap
real_op = op._op
spec = functional.OPERATORS["all_reduce"]
call = BoundCall(spec, real_op, params=[a.name for a in op._schema.arguments])
call.measure = False
call.op_id = rec.writer.intern(spec.name)
patched_op = wrap(rec, call, real_op)  # the C fast path around the operator's builtin
if call.fast is not None:
    call.fast.op_id = call.op_id
def op_toggle(on):
    functional.uninstall()
    op._op = patched_op if on else real_op

real_funcol = funcol.all_reduce
def wrapped_all_reduce(*args, **kwargs):
    return real_funcol(*args, **kwargs)

class PassOn(TorchDispatchMode):
    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        return func(*args, **(kwargs or {}))

def issue():
    for _ in range(calls):
        op(t, "sum", name)

def issued_then_waited():  # the waits alone are timed by the difference
    outs = [op(t, "sum", name) for _ in range(calls)]
    t0 = time.perf_counter()
    for y in outs:
        wait(y)
    return time.perf_counter() - t0

def pair():
    for _ in range(calls):
        wait(op(t, "sum", name))

def funcol_call():
    for _ in range(calls):
        funcol.all_reduce(t, "sum", fake)

def add():
    for _ in range(calls):
        torch.add(t, 1)

def timed(fn):
    t0 = time.perf_counter()
    inner = fn()
    return (inner if inner is not None else time.perf_counter() - t0) / calls * 1e6

results = {}
def paired(key, fn, toggle):
    diffs, on_times = [], []
    for _ in range(rounds):
        for state in (False, True):
            toggle(state)
            took = timed(fn)
            if state:
                diffs.append(took - off)
                on_times.append(took)
            else:
                off = took
    toggle(False)
    results[key] = {"added_us": statistics.median(diffs), "with_us": statistics.median(on_times)}

paired("issue", issue, recording)
paired("wait", issued_then_waited, recording)
paired("pair", pair, recording)
paired("empty_kernel", issue, empty)
paired("patched_op", issue, op_toggle)
def wrapper_toggle(on):
    funcol.all_reduce = wrapped_all_reduce if on else real_funcol
paired("python_wrapper", funcol_call, wrapper_toggle)
mode = [None]
def mode_toggle(on):
    if on and mode[0] is None:
        mode[0] = PassOn(); mode[0].__enter__()
    elif not on and mode[0] is not None:
        mode[0].__exit__(None, None, None); mode[0] = None
paired("dispatch_mode_per_op", add, mode_toggle)
print(json.dumps(results))
"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--calls", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=30)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        script = Path(tmp) / "functional_child.py"  # a file: frames of `python -c` are no site
        script.write_text(CHILD)
        env = dict(os.environ, BENCH_DIR=str(Path(tmp) / "capture"), MASTER_ADDR="127.0.0.1",
                   MASTER_PORT=str(free_port()), OMP_NUM_THREADS="1")
        proc = subprocess.run([sys.executable, str(script), str(args.calls), str(args.rounds)],
                              env=env, capture_output=True, text=True, timeout=1800)
        if proc.returncode != 0:
            sys.exit(f"the benchmark's process failed:\n{proc.stderr[-3000:]}")
        results = json.loads(proc.stdout.strip().splitlines()[-1])
    print(f"{args.rounds} paired rounds of {args.calls} calls; median per call, microseconds")
    print(f"{'':34} {'with':>8} {'added':>8}")
    labels = {
        "issue": "all_reduce (the issue), recorded",
        "wait": "wait_tensor (the completion), recorded",
        "pair": "all_reduce + wait_tensor, recorded",
        "empty_kernel": "option: an empty dispatcher kernel",
        "patched_op": "option: OpOverload._op recorded in C",
        "python_wrapper": "option: a Python funcol wrapper",
        "dispatch_mode_per_op": "option: a dispatch mode, per op",
    }
    for key, label in labels.items():
        r = results[key]
        print(f"{label:34} {r['with_us']:8.2f} {r['added_us']:8.2f}")
    issue, wait = results["issue"]["added_us"], results["wait"]["added_us"]
    worst = max(issue, wait)
    print(f"goal: <= {GOAL_US} us added per functional call; worst of issue and wait "
          f"{worst:.2f} us (ratio {worst / GOAL_US:.2f})")
    print(f"functional_overhead issue_us={issue:.2f} wait_us={wait:.2f} "
          f"pair_us={results['pair']['added_us']:.2f} "
          f"empty_kernel_us={results['empty_kernel']['added_us']:.2f} "
          f"goal_ratio={worst / GOAL_US:.2f}")


if __name__ == "__main__":
    main()
