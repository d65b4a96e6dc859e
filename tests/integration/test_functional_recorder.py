"""The functional collectives' recorder (rank/recorder/functional.py) in one real rank: a 1-rank
gloo job in a process of its own makes funcol calls eagerly, through torch.compile (whose tracing
runs them on fake tensors first), under torch.inference_mode, and with the recorder told not to
record them; the capture holds exactly the real calls, with PyTorch's sequence numbers, their
waits, and what each call returned unchanged - under either recording kernel, the C++ one and
the Python one (tests/integration/functional_kernels.py)."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from nccl_doctor.analysis.calls.loaded import load_capture_dir
from nccl_doctor.model import EventFlag, EventKind, EventSource, EventState

from functional_kernels import KERNELS, kernel_env  # (this directory: on sys.path)

pytestmark = pytest.mark.integration

JOB = r'''
import json, os, sys
import nccl_doctor
nccl_doctor.install(sys.argv[1])
import torch, torch.distributed as dist
import torch.distributed._functional_collectives as funcol

dist.init_process_group("gloo", rank=0, world_size=1)
group = dist.group.WORLD
seq = group._get_sequence_number_for_group
out = {"seqs": [], "values": []}

def eager(x):
    y = funcol.all_reduce(x, "sum", group)  # line 14: the eager call
    return y.wait()

for _ in range(2):
    out["seqs"].append(seq() + 1)
    out["values"].append(eager(torch.full((4,), 3.0)).tolist())

def step(x):
    return funcol.all_gather_tensor(x * 2, 0, group) + 1

compiled = torch.compile(step, backend="aot_eager")
for _ in range(3):  # the first call traces step on fake tensors: none of that is a call
    out["seqs"].append(seq() + 1)
    out["values"].append(compiled(torch.ones(2)).tolist())

x = torch.ones(4, requires_grad=True)
out["seqs"].append(seq() + 1)
y = funcol.all_gather_tensor_autograd(x, 0, group)  # the autograd variant
out["seqs"].append(seq() + 1)
y.sum().backward()  # its backward: a reduce_scatter
out["seqs"].append(seq() + 1)
torch.ops._dtensor.shard_dim_alltoall(torch.ones(4, 2), 0, 1, group.group_name)  # DTensor's C++

with torch.inference_mode():  # not seen: the dispatcher key the recorder uses is off
    funcol.all_reduce(torch.ones(2), "sum", group).wait()
out["unseen"] = seq()
out["last"] = seq() + 1
dist.all_reduce(torch.ones(2))
dist.destroy_process_group()
print(json.dumps(out))
'''


def run_job(tmp_path: Path, **env: str) -> tuple[dict, list]:
    script = tmp_path / "functional_job.py"
    script.write_text(JOB)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    environ = dict(os.environ, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), **env)
    proc = subprocess.run([sys.executable, str(script), str(tmp_path / "capture")], env=environ,
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    (trace,) = load_capture_dir(tmp_path / "capture").ranks.values()
    return out, trace.events


@pytest.mark.parametrize("kernel", KERNELS)
def test_every_real_functional_call_is_recorded_once_with_torchs_sequence_number(tmp_path,
                                                                                 kernel):
    out, events = run_job(tmp_path, **kernel_env(kernel))
    issued = [e for e in events if e.source is EventSource.FUNCTIONAL
              and e.kind is EventKind.COLLECTIVE]
    assert [e.seq for e in issued] == out["seqs"], [(e.op, e.seq) for e in issued]
    assert [e.op for e in issued] == ["all_reduce"] * 2 + ["all_gather_into_tensor"] * 4 + [
        "reduce_scatter_tensor", "all_to_all_single"]
    assert all(e.flags & EventFlag.FUNCTIONAL for e in issued)
    assert issued[0].input == "float32[4]" and issued[2].input == "float32[2]", issued[2]
    # the eager calls name the user's line; the compiled ones the line calling the compiled
    # function (torch.compile's rewrite of step, its graph and its wrapper are torch's)
    script = str(tmp_path / "functional_job.py")
    assert (issued[0].callsite.path, issued[0].callsite.line) == (script, 14)
    assert issued[2].callsite.path == script and issued[2].callsite.function == "<module>"
    # each completion: a WAIT record under its collective, with its sequence number
    waits = [e for e in events if e.kind is EventKind.WAIT][:5]
    assert [w.parent for w in waits] == [e.idx for e in issued[:5]], (waits, issued)
    assert [w.seq for w in waits] == out["seqs"][:5]
    assert all(w.state is EventState.RETURNED for w in waits)
    # what the calls returned is the operators' own (1 rank: the sum and the gather of itself)
    assert out["values"][:2] == [[3.0] * 4] * 2
    assert out["values"][2:] == [[3.0, 3.0]] * 3
    # the backward's reduce_scatter names the line that ran backward
    assert issued[6].callsite.line == issued[5].callsite.line + 2, issued[6].callsite
    # the call under inference_mode took its number with no record; the next call is in step
    last = next(e for e in events if e.op == "all_reduce" and e.source is EventSource.RECORDER)
    assert last.seq == out["last"] and out["unseen"] not in [e.seq for e in events]


def test_told_not_to_it_records_the_python_api_alone(tmp_path):
    out, events = run_job(tmp_path, NCCL_DOCTOR_FUNCTIONAL="0")
    assert not [e for e in events if e.source is EventSource.FUNCTIONAL], events
    assert [e.op for e in events if e.kind is EventKind.COLLECTIVE] == ["all_reduce"]
    assert out["values"][:2] == [[3.0] * 4] * 2
