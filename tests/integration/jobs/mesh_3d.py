"""A 3-D DeviceMesh on gloo (8 ranks): 2 pipeline stages x 2 data-parallel replicas x 2
tensor-parallel ranks, made with ``init_device_mesh("cpu", (2, 2, 2), ("pp", "dp", "tp"))``
(rank = 4 * stage + 2 * replica + tp index). Each step, in each pipeline stage the
tensor-parallel group all-reduces its activations (a row-split layer's partial sums); stage 0
sends them to the rank of stage 1 at the same (dp, tp) coordinates with ``dist.send`` over the
pipeline group, stage 1 receives them with ``dist.recv``; each stage computes its loss, and the
data-parallel group all-reduces the gradients. SCENARIO picks one (default skip):

- skip: rank SKIP_RANK (default 6) does not all-reduce its gradients at step SKIP_STEP
  (default 1): a branch on the rank (SKIP_RANK=-1: its healthy twin)
- nan_guard: the labels of stage 1's replica NAN_REPLICA (default 0) hold a NaN at step
  NAN_STEP (default 1): the ranks of that tensor-parallel group (4 and 5, or 6 and 7), whose loss
  is NaN, leave the step by ``if not torch.isfinite(loss): continue`` before the data-parallel
  all_reduce; the other replica's stage 1 waits in its last one (NAN_STEP=-1: its healthy
  twin)

Each scenario has a loop of its own, so that each loop holds the one thing that parts its
ranks: the rank's branch, or the data's jump.
"""
import os
from datetime import timedelta

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh

ROWS, WIDTH = 4, 8
STEPS = 3


def load_batch(replica: int, step: int) -> torch.Tensor:
    """Stage 0's input: one batch per data-parallel replica (the same on its tensor-parallel
    ranks)."""
    return torch.randn(ROWS, WIDTH, generator=torch.Generator().manual_seed(10 * step + replica))


def load_labels(replica: int, step: int, nan_replica: int, nan_step: int) -> torch.Tensor:
    """Stage 1's labels; a NaN in replica ``nan_replica``'s at ``nan_step`` stands for a bad
    sample."""
    labels = torch.zeros(ROWS, WIDTH)
    if replica == nan_replica and step == nan_step:
        labels[1, 2] = float("nan")
    return labels


def stage_forward(stage, replica, step, weight, first, last, pp, tp, labels):
    """This rank's part of the step's forward: the tensor-parallel all_reduce of the
    activations, and the pipeline's send (stage 0) or receive (stage 1); its loss."""
    if stage == 0:
        act = load_batch(replica, step) @ weight
        dist.all_reduce(act, group=tp)  # the tensor-parallel partial sums
        dist.send(act, dst=last, group=pp)
        return act.pow(2).mean()
    received = torch.empty(ROWS, WIDTH)
    dist.recv(received, src=first, group=pp)
    act = received @ weight
    dist.all_reduce(act, group=tp)
    return (act - labels).pow(2).mean()


def main() -> None:
    dist.init_process_group("gloo", timeout=timedelta(seconds=60))
    rank = dist.get_rank()
    scenario = os.environ.get("SCENARIO", "skip")
    skip_rank = int(os.environ.get("SKIP_RANK", "6"))
    skip_step = int(os.environ.get("SKIP_STEP", "1"))
    nan_replica = int(os.environ.get("NAN_REPLICA", "0"))
    nan_step = int(os.environ.get("NAN_STEP", "1"))
    mesh = init_device_mesh("cpu", (2, 2, 2), mesh_dim_names=("pp", "dp", "tp"))
    pp, dp, tp = mesh.get_group("pp"), mesh.get_group("dp"), mesh.get_group("tp")
    stage, replica = mesh.get_local_rank("pp"), mesh.get_local_rank("dp")
    first, last = mesh["pp"].mesh.tolist()  # this rank's pipeline: its two stages' ranks
    torch.manual_seed(stage)
    weight = torch.randn(WIDTH, WIDTH) / WIDTH  # this rank's shard of its stage's layer
    if scenario == "skip":
        for step in range(STEPS):
            loss = stage_forward(stage, replica, step, weight, first, last, pp, tp,
                                 torch.zeros(ROWS, WIDTH))
            grad = weight * loss
            if rank != skip_rank or step != skip_step:
                dist.all_reduce(grad, group=dp)  # the replicas' gradients, averaged
            weight -= 0.01 * grad
    elif scenario == "nan_guard":
        for step in range(STEPS):
            labels = load_labels(replica, step, nan_replica, nan_step)
            loss = stage_forward(stage, replica, step, weight, first, last, pp, tp, labels)
            if not torch.isfinite(loss):
                continue
            grad = weight * loss
            dist.all_reduce(grad, group=dp)  # the replicas' gradients, averaged
            weight -= 0.01 * grad
    else:
        raise SystemExit(f"unknown SCENARIO {scenario!r}")
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
