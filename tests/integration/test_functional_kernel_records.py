"""The functional collectives' two recording kernels (rank/recorder/functional.py): the C++ one
(_functional_kernel.cpp, built by make install) and the Python one, each in a real 1-rank gloo
job making the same calls - eager funcol calls and the operators themselves (the group by name
and as a ProcessGroup), coalesced ones, rooted ones, a compiled graph, an autograd variant and
its backward, DTensor's own C++ operator, calls from a Python thread and from a C++ thread
(TorchScript's fork: no Python frame), calls that raise, calls under inference_mode - write the
same records, call for call, and give the calls' results and errors unchanged.

The C++ kernel must be built where it can be (tests/integration/functional_kernels.py)."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from nccl_doctor.analysis.calls.loaded import load_capture_dir
from nccl_doctor.model import EventKind, EventSource, EventState

from functional_kernels import kernel_env  # (this directory: on sys.path)

pytestmark = pytest.mark.integration

JOB = r'''
import json, os, sys, threading
import nccl_doctor
nccl_doctor.install(sys.argv[1])
import torch, torch.distributed as dist
import torch.distributed._functional_collectives as funcol
from nccl_doctor.rank.recorder import functional

functional._MAX_ISSUED = 16  # (4096: a small number makes the job's calls beyond it few)
dist.init_process_group("gloo", rank=0, world_size=1)
group = dist.group.WORLD
name = group.group_name
ops = torch.ops._c10d_functional
out = {"kernel": functional.KERNEL, "why": functional.KERNEL_WHY, "values": [], "errors": []}

def keep(t):
    out["values"].append(t.tolist())

for _ in range(3):  # each line's first call is recorded by the Python path, the next ones fast
    keep(funcol.all_reduce(torch.full((4,), 3.0), "sum", group).wait())
for pg in (name, group):  # the operators take the group by name or as the ProcessGroup
    for _ in range(2):
        keep(ops.wait_tensor(ops.all_reduce(torch.ones(2, 3), "avg", pg)))
for _ in range(2):
    outs = ops.all_reduce_coalesced([torch.ones(2), torch.ones(3)], "sum", name)
    [keep(ops.wait_tensor(o)) for o in outs]
    keep(ops.wait_tensor(ops.broadcast(torch.ones(5), 0, name)))
    keep(ops.wait_tensor(ops.all_to_all_single(torch.ones(4), [4], [4], name)))
    keep(ops.wait_tensor(ops.all_gather_into_tensor_out(torch.ones(2), 1, name,
                                                        out=torch.empty(2))))
    keep(ops.wait_tensor(ops.reduce_scatter_tensor(torch.ones(2), "sum", 1, name)))
    inplace = torch.ones(3)
    ops.wait_tensor(ops.all_reduce_(inplace, "sum", name))
    keep(inplace)
for _ in range(2):  # errors: the same, whether the record is the Python path's or the fast one's
    try:  # (gloo finds the sizes wrong in its thread: the wait raises)
        ops.wait_tensor(ops.all_to_all_single(torch.ones(4), [3], [4], name))
    except RuntimeError as err:
        out["errors"].append(str(err).splitlines()[0])
    try:
        ops.all_reduce(torch.ones(2), "bogus", name)
    except RuntimeError as err:
        out["errors"].append(str(err).splitlines()[0])

def step(x):
    return funcol.all_gather_tensor(x * 2, 0, group) + 1

compiled = torch.compile(step, backend="aot_eager")
for _ in range(3):  # its first call traces step on fake tensors: none of that is a call
    keep(compiled(torch.ones(2)))
x = torch.ones(4, requires_grad=True)
y = funcol.all_gather_tensor_autograd(x, 0, group)
y.sum().backward()  # the backward's reduce_scatter, issued from C++
keep(x.grad)
keep(torch.ops._dtensor.shard_dim_alltoall(torch.ones(4, 2), 0, 1, name))

# more outstanding than a kernel keeps (_MAX_ISSUED): the oldest waits go unrecorded
outs = [ops.all_reduce(torch.ones(1), "sum", name) for _ in range(16 + 4)]
[ops.wait_tensor(o) for o in outs]
del outs
for _ in range(50):  # never waited for, gone at once: each kernel lets go of them
    ops.all_reduce(torch.ones(1), "sum", name)
keep(ops.wait_tensor(ops.all_reduce(torch.ones(2), "sum", name)))

def in_thread():
    for _ in range(2):
        keep(funcol.all_reduce(torch.ones(3), "sum", group).wait())

thread = threading.Thread(target=in_thread)
thread.start()
thread.join()

@torch.jit.script
def scripted(x: torch.Tensor, name: str) -> torch.Tensor:
    return torch.ops._c10d_functional.wait_tensor(
        torch.ops._c10d_functional.all_reduce(x, "sum", name))

@torch.jit.script
def forked(x: torch.Tensor, name: str) -> torch.Tensor:  # on a C++ thread: no Python frame
    return torch.jit.wait(torch.jit.fork(scripted, x, name))

for _ in range(2):
    keep(forked(torch.ones(3), name))
with torch.inference_mode():  # not seen: the dispatcher key both kernels use is off
    keep(funcol.all_reduce(torch.ones(2), "sum", group).wait())
dist.all_reduce(torch.ones(2))
dist.destroy_process_group()
if out["kernel"] == "cpp":  # how the C++ kernel's calls went: recorded fast or in Python
    from nccl_doctor.rank.recorder import _functional_kernel
    out["counts"] = _functional_kernel.counts()
print(json.dumps(out))
'''


#: The collectives the job makes, by op (the records' names: all_reduce_ is an all_reduce).
EXPECTED = {
    # funcol, the operator, all_reduce_, raised, outstanding, unwaited, threads
    "all_reduce": 3 + 4 + 2 + 2 + (16 + 4 + 50 + 1) + 2 + 2,
    "all_reduce_coalesced": 2,
    "broadcast": 2,
    "all_to_all_single": 2 + 2 + 1,  # the operator, raised, DTensor's shard_dim_alltoall
    "all_gather_into_tensor": 2 + 3 + 1,  # the _out operator, compiled, the autograd variant
    "reduce_scatter_tensor": 2 + 1,  # the operator, the autograd variant's backward
}


def run_job(tmp_path: Path, kernel: str, **env: str) -> tuple[dict, list]:
    here = tmp_path / f"{kernel}{len(list(tmp_path.iterdir()))}"
    here.mkdir()
    script = here / "kernels_job.py"
    script.write_text(JOB)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    environ = dict(os.environ, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port),
                   NCCL_DOCTOR_FUNCTIONAL_KERNEL=kernel, **env)
    proc = subprocess.run([sys.executable, str(script), str(here / "capture")], env=environ,
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    out["stderr"], out["script"] = proc.stderr, str(script)
    (trace,) = load_capture_dir(here / "capture").ranks.values()
    return out, trace.events


def comparable(events: list, script: str = "") -> list[tuple]:
    """Each record as both kernels must write it: everything but its times, its thread said as
    the main one or another (a thread's id is reused once it ended) and the job's script by one
    name."""
    main = events[0].thread if events else 0
    return [repr((e.idx, e.parent, e.kind, e.op, e.group, e.seq, e.seq_offset, e.seq_delta,
                  e.state, e.flags, e.input, e.output, e.nbytes, e.peer, e.group_size,
                  e.callsite, e.api_callsite, e.path, e.source,
                  e.thread == main)).replace(script or "\0", "JOB")
            for e in events]


def test_the_cpp_and_python_kernels_write_the_same_records(tmp_path):
    kernel_env("cpp")  # (a failure where the C++ kernel can be built but is not)
    cpp, cpp_events = run_job(tmp_path, "cpp")
    python, python_events = run_job(tmp_path, "python")
    assert (cpp["kernel"], python["kernel"]) == ("cpp", "python"), (cpp, python)
    assert cpp["values"] == python["values"]
    assert cpp["errors"] == python["errors"] and len(cpp["errors"]) == 4, cpp["errors"]
    # (the scripts' paths differ: each job has its own directory)
    assert comparable(cpp_events, cpp["script"]) == comparable(python_events, python["script"])
    functional = [e for e in cpp_events if e.source is EventSource.FUNCTIONAL]
    issued = [e for e in functional if e.kind is EventKind.COLLECTIVE]
    waits = [e for e in functional if e.kind is EventKind.WAIT]
    # what the job made: every call recorded once, each wait under the call it completes
    parents = {e.idx: e for e in issued}
    ops = [e.op for e in issued]
    assert {op: ops.count(op) for op in EXPECTED} == EXPECTED
    assert len(ops) == sum(EXPECTED.values())
    failed = [e for e in functional if e.state is EventState.FAILED]
    assert [(e.kind, e.op) for e in failed] == [(EventKind.WAIT, "wait"),
                                                (EventKind.COLLECTIVE, "all_reduce")] * 2, failed
    assert all(parents[e.parent].op == "all_to_all_single" for e in failed[::2]), failed
    assert waits and all(w.parent in parents and w.seq == parents[w.parent].seq
                         for w in waits), waits
    # of the 20 outstanding at once, the first four were forgotten: their waits unrecorded
    many = [e.idx for e in issued if e.input == "float32[1]"][:20]
    waited = {w.parent for w in waits}
    assert [i in waited for i in many] == [False] * 4 + [True] * 16
    # the C++ kernel recorded most calls by the fast path: the Python path took a line's first
    # call (and the calls with no Python frame), which filled the caches the fast path reads;
    # most of the fast ones came from the frames of the call before (no walk of the frames)
    counts = cpp["counts"]
    fast = counts["issue_fast"] + counts["issue_fast_known"]
    assert fast + counts["issue_python"] == len(issued), counts
    assert counts["issue_fast_known"] >= 60 and counts["issue_fast"] >= 10, counts
    assert counts["wait_fast"] == len(waits), counts
    # the calls from the C++ thread: recorded on their thread, with no Python line to name
    main = issued[0].thread
    forked = [e for e in issued if e.thread != main and e.callsite is None]
    assert len(forked) == 2, [(e.op, e.thread, e.callsite) for e in issued]
    # the calls made on the job's lines name them
    line = JOB.splitlines().index(
        '    keep(funcol.all_reduce(torch.full((4,), 3.0), "sum", group).wait())') + 1
    assert (issued[0].callsite.path, issued[0].callsite.line) == (cpp["script"], line), issued[0]


def test_without_the_c_fast_path_the_python_kernel_records_and_cpp_is_refused(tmp_path):
    """The C++ kernel records through the recorder's C fast path: with the Python ring
    (NCCL_DOCTOR_PURE_PYTHON=1) the Python kernel records the calls; asked for the C++ one
    (NCCL_DOCTOR_FUNCTIONAL_KERNEL=cpp) the rank says why it cannot have it and records the
    Python API alone - the calls' results unchanged either way."""
    auto, auto_events = run_job(tmp_path, "auto", NCCL_DOCTOR_PURE_PYTHON="1")
    assert auto["kernel"] == "python", auto
    assert "C fast path, which it records through, is not in use" in auto["why"], auto
    functional = [e for e in auto_events if e.source is EventSource.FUNCTIONAL]
    assert len([e for e in functional if e.kind is EventKind.COLLECTIVE]) == sum(
        EXPECTED.values())
    asked, asked_events = run_job(tmp_path, "cpp", NCCL_DOCTOR_PURE_PYTHON="1")
    assert asked["kernel"] == "", asked
    assert "NCCL_DOCTOR_FUNCTIONAL_KERNEL=cpp, but the C++ kernel" in asked["stderr"], asked
    assert not [e for e in asked_events if e.source is EventSource.FUNCTIONAL], asked_events
    assert [e.op for e in asked_events if e.kind is EventKind.COLLECTIVE] == ["all_reduce"]
    assert asked["values"] == auto["values"] and asked["errors"] == auto["errors"]
