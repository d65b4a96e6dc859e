"""FSDP2 + tensor parallel on a 2 x 2 DeviceMesh ("dp", "tp") on gloo (CPU, 4 ranks): a tiny
two-layer MLP whose first layer is split by columns and second by rows over the "tp" dim
(``parallelize_module`` with ColwiseParallel / RowwiseParallel: the rows' partial sums are
all-reduced in the tensor-parallel group), then sharded over the "dp" dim with FSDP2's
``fully_shard`` (its parameters all-gathered in the data-parallel group before the forward and
again before the backward, the gradients reduce-scattered after it). A few training steps:
forward, backward, optimizer step; each data-parallel replica reads its own batch, the ranks of
one tensor-parallel group the same batch. SCENARIO picks one (default skip):

- skip: rank SKIP_RANK (default 3) skips the backward and the optimizer step of step SKIP_STEP
  (default 1): a branch on the rank (SKIP_RANK=-1: its healthy twin)
- nan_guard: the batch of data-parallel replica NAN_REPLICA (default 0: ranks 0, 1) holds a NaN
  at step NAN_STEP (default 1); ``if not torch.isfinite(loss): continue`` skips that step's
  backward and optimizer step on the ranks that see it (the replica's two tensor-parallel ranks,
  whose loss is the same), so the two replicas' data-parallel calls part (NAN_STEP=-1: its
  healthy twin)

Each scenario has a loop of its own, so that each loop holds the one thing that parts its
ranks: the rank's branch, or the data's jump.
"""
import os
import warnings
from datetime import timedelta

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

try:
    from torch.distributed.fsdp import fully_shard
except ImportError:  # (torch before 2.6)
    from torch.distributed._composable.fsdp import fully_shard

# (a tensor-parallel layer's output is its DTensor's local view: FSDP2 warns that an in-place op
# on it would skip its pre-backward hook; this model makes none)
warnings.filterwarnings("ignore", message="FSDP2-wrapped module")

WIDTH, HIDDEN, ROWS = 16, 32, 8
STEPS = 4


class MLP(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.up = torch.nn.Linear(WIDTH, HIDDEN)
        self.down = torch.nn.Linear(HIDDEN, WIDTH)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.tanh(self.down(torch.relu(self.up(x))))


def load_batch(replica: int, step: int, nan_replica: int, nan_step: int) -> torch.Tensor:
    """The replica's batch (the same on its tensor-parallel ranks); a NaN in replica
    ``nan_replica``'s batch at ``nan_step`` stands for a bad sample."""
    batch = torch.randn(ROWS, WIDTH, generator=torch.Generator().manual_seed(100 * step + replica))
    if replica == nan_replica and step == nan_step:
        batch[0, 3] = float("nan")
    return batch


def main() -> None:
    dist.init_process_group("gloo", timeout=timedelta(seconds=60))
    rank = dist.get_rank()
    scenario = os.environ.get("SCENARIO", "skip")
    skip_rank = int(os.environ.get("SKIP_RANK", "3"))
    skip_step = int(os.environ.get("SKIP_STEP", "1"))
    nan_replica = int(os.environ.get("NAN_REPLICA", "0"))
    nan_step = int(os.environ.get("NAN_STEP", "1"))
    mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp", "tp"))
    replica = mesh.get_local_rank("dp")
    torch.manual_seed(0)
    model = MLP()
    parallelize_module(model, mesh["tp"], {"up": ColwiseParallel(), "down": RowwiseParallel()})
    for layer in (model.up, model.down):  # each layer its own FSDP unit, then the root
        fully_shard(layer, mesh=mesh["dp"])
    fully_shard(model, mesh=mesh["dp"])
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    if scenario == "skip":
        for step in range(STEPS):
            optimizer.zero_grad()
            loss = model(load_batch(replica, step, -1, -1)).pow(2).mean()
            if rank == skip_rank and step == skip_step:
                continue
            loss.backward()
            optimizer.step()
    elif scenario == "nan_guard":
        for step in range(STEPS):
            optimizer.zero_grad()
            loss = model(load_batch(replica, step, nan_replica, nan_step)).pow(2).mean()
            if not torch.isfinite(loss):
                continue
            loss.backward()
            optimizer.step()
    else:
        raise SystemExit(f"unknown SCENARIO {scenario!r}")
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
