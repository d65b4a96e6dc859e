"""Functional collectives (issue 40): DTensor on a CPU device mesh, tensor parallel, funcol,
torch.compile and FSDP2, healthy and broken the ways users break them. SCENARIO picks one; the
tests (tests/integration/test_functional_jobs.py) find the lines they name by their text."""
import os
import time

import torch
import torch.distributed as dist
import torch.distributed._functional_collectives as funcol
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import DTensor, Replicate, Shard, distribute_tensor

SCENARIO = os.environ.get("SCENARIO", "dtensor_healthy")


def dtensor(mesh, rank: int) -> None:
    big = torch.arange(64, dtype=torch.float32).reshape(8, 8)
    dt = distribute_tensor(big, mesh, [Shard(0)])
    total = 0.0
    for step in range(4):
        if SCENARIO == "dtensor_skip" and rank == 1 and step == 2:
            continue  # the bug: this rank thinks it has nothing to gather this step
        full = dt.redistribute(mesh, [Replicate()])
        total += float(full.to_local().sum())
    if SCENARIO == "dtensor_rank0":
        if rank == 0:
            replicated = dt.redistribute(mesh, [Replicate()])  # a gather on rank 0 alone
            total += float(replicated.to_local().sum())
        summary = torch.tensor([total])
        dist.all_reduce(summary)


def dtensor_shapes(mesh, rank: int) -> None:
    rows = 4 + rank  # the bug: each rank's shard has its own length
    local = torch.ones(rows, 8)
    dt = DTensor.from_local(local, mesh, [Shard(0)], run_check=False)
    full = dt.full_tensor()
    print(full.shape)


def tensor_parallel(mesh, rank: int) -> None:
    from torch.distributed.tensor.parallel import (
        ColwiseParallel, RowwiseParallel, parallelize_module,
    )

    torch.manual_seed(0)
    mlp = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 16))
    mlp = parallelize_module(mlp, mesh, {"0": ColwiseParallel(), "2": RowwiseParallel()})
    for step in range(3):
        x = torch.ones(4, 16) * step
        if SCENARIO == "tp_skip" and rank == 1 and step == 1:
            continue  # the bug: this rank skips a forward
        out = mlp(x)
        out.sum().backward()


def compiled(mesh, rank: int) -> None:
    group = dist.group.WORLD

    def step(x):
        y = funcol.all_reduce(x * 2, "sum", group)
        return y + 1

    fn = torch.compile(step, backend=os.environ.get("COMPILE_BACKEND", "inductor"))
    x = torch.ones(8)
    calls = 3 + (1 if SCENARIO == "compile_extra" and rank == 1 else 0)
    for _ in range(calls):  # the bug: rank 1 runs one step more
        x = fn(x)
    torch.distributed.barrier()


def fsdp2(mesh, rank: int) -> None:
    from torch.distributed.fsdp import fully_shard

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Linear(8, 4))
    for layer in model:
        fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for step in range(3):
        if SCENARIO == "fsdp2_skip" and rank == 1 and step == 1:
            continue  # the bug: this rank skips a training step
        loss = model(torch.ones(2, 8)).sum()
        loss.backward()
        opt.step()
        opt.zero_grad()


def unseen(mesh, rank: int) -> None:
    """Calls nothing records: DistributedDataParallel's broadcast at its construction and its
    gradient all_reduce, issued from C++, take their group's sequence numbers with no record;
    so does (unseen_one_side, rank 0 only) a functional all_reduce under torch.inference_mode,
    which leaves out the dispatcher key the recorder uses, while rank 1 makes it recorded."""
    from torch.nn.parallel import DistributedDataParallel

    torch.manual_seed(0)
    model = DistributedDataParallel(torch.nn.Linear(4, 4))
    group = dist.group.WORLD
    t = torch.ones(4)
    for step in range(3):
        dist.all_reduce(t)
        model(torch.ones(2, 4)).sum().backward()
        if SCENARIO == "unseen_one_side":
            if rank == 1:
                funcol.all_reduce(t, "sum", group).wait()
            else:
                with torch.inference_mode():
                    funcol.all_reduce(torch.ones(4), "sum", group).wait()
        if SCENARIO == "unseen_skip" and rank == 1 and step == 2:
            continue  # the bug: rank 1 skips the broadcast on its last step
        dist.broadcast(t, src=0)


def left_first(mesh, rank: int) -> None:
    """Rank 1 makes one call fewer, tears its process group down and lingers on its way out:
    rank 0's "Connection closed by peer" comes before rank 1's exit is seen."""
    t = torch.ones(4)
    for step in range(3):
        if rank == 1 and step == 2:
            break  # the bug: rank 1 leaves its loop a step early
        dist.all_reduce(t)
    if rank == 1:
        dist.destroy_process_group()
        time.sleep(3)  # (a slow teardown: its exit is stamped after rank 0's error)
        raise SystemExit(0)


def left_first_data(mesh, rank: int) -> None:
    """As left_first, with no branch to read: the number of steps is the rank's own. The
    all_reduce is async: rank 0's error surfaces in its wait, after the call returned."""
    t = torch.ones(4)
    for step in range(3 - rank):  # the bug: each rank's data has its own number of batches
        dist.all_reduce(t, async_op=True).wait()
    if rank == 1:
        dist.destroy_process_group()
        time.sleep(3)  # (a slow teardown: its exit is stamped after rank 0's error)


def left_unseen(mesh, rank: int) -> None:
    """Rank 1 leaves while rank 0 is in a call nothing recorded (DDP's gradient all_reduce,
    issued from C++): the recorded calls of the two ranks are as many; rank 0's "Connection
    closed by peer" comes after rank 1 let go of its process group."""
    from torch.nn.parallel import DistributedDataParallel

    torch.manual_seed(0)
    model = DistributedDataParallel(torch.nn.Linear(4, 4))
    t = torch.ones(4)
    for step in range(3 - rank):  # the bug: each rank's data has its own number of batches
        model(torch.ones(2, 4)).sum().backward()
        dist.all_reduce(t)


RUN = {"dtensor_healthy": dtensor, "dtensor_skip": dtensor, "dtensor_rank0": dtensor,
       "dtensor_shapes": dtensor_shapes, "tp_healthy": tensor_parallel, "tp_skip": tensor_parallel,
       "compile_healthy": compiled, "compile_extra": compiled, "fsdp2_healthy": fsdp2,
       "fsdp2_skip": fsdp2, "unseen_healthy": unseen, "unseen_one_side": unseen,
       "unseen_skip": unseen, "left_first": left_first, "left_first_data": left_first_data,
       "left_unseen": left_unseen}


def main() -> None:
    from datetime import timedelta

    dist.init_process_group("gloo", timeout=timedelta(seconds=float(
        os.environ.get("GLOO_TIMEOUT_S", "1800"))))
    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    RUN[SCENARIO](mesh, dist.get_rank())
    if dist.is_initialized():
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
