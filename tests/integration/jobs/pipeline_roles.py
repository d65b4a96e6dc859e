"""A healthy pipeline of 2 stages x 2 replicas on a 2 x 2 DeviceMesh ("dp", "pp"), made with
torch's own pipelining (PipelineStage, ScheduleGPipe) on gloo: ranks 0 and 1 are replica 0's
stages 0 and 1, ranks 2 and 3 replica 1's. Each step runs the schedule, averages the gradients
over the stage's data-parallel group and all-reduces the loss over the world (what a training
loop logs). SCENARIO picks one:

- imbalanced: the last stage is slower per microbatch (SLOW_MS in its forward) and scores the
  outputs after the schedule (SLOW_MS more): it arrives last at the world all_reduce by design
- slow_replica: as imbalanced, and rank SLOW_RANK also sleeps SLOW_RANK_MS before each step (its
  input pipeline): a straggler among the ranks of its stage
"""
from __future__ import annotations

import os
import time
from datetime import timedelta

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.pipelining import PipelineStage, ScheduleGPipe

WIDTH = 16
MICRO = 4  # microbatches per step
ROWS = 8  # rows per step
SLOW_MS = float(os.environ.get("SLOW_MS", "40"))
STEPS = int(os.environ.get("STEPS", "12"))


class Part(torch.nn.Module):
    """One stage's layers; the last stage's forward also takes ``slow_s`` per microbatch."""

    def __init__(self, slow_s: float) -> None:
        super().__init__()
        self.layer = torch.nn.Linear(WIDTH, WIDTH)
        self.slow_s = slow_s

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.slow_s:
            time.sleep(self.slow_s)  # the last stage's heavier layers
        return torch.relu(self.layer(x))


def main() -> None:
    dist.init_process_group("gloo", timeout=timedelta(seconds=60))
    rank = dist.get_rank()
    scenario = os.environ.get("SCENARIO", "imbalanced")
    mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp", "pp"))
    pp, dp = mesh.get_group("pp"), mesh.get_group("dp")
    stage_index = mesh.get_local_rank("pp")
    last = stage_index == 1
    torch.manual_seed(stage_index)  # the replicas of a stage start from the same weights
    part = Part(SLOW_MS / 1e3 if last else 0.0)
    stage = PipelineStage(part, stage_index, 2, torch.device("cpu"), group=pp)
    schedule = ScheduleGPipe(stage, n_microbatches=MICRO,
                             loss_fn=lambda out, target: ((out - target) ** 2).mean())
    slow_rank = int(os.environ.get("SLOW_RANK", "2")) if scenario == "slow_replica" else -1
    slow_rank_s = float(os.environ.get("SLOW_RANK_MS", "150")) / 1e3
    opt = torch.optim.SGD(part.parameters(), lr=0.01)
    gen = torch.Generator().manual_seed(100 + mesh.get_local_rank("dp"))
    for _ in range(STEPS):
        if rank == slow_rank:
            time.sleep(slow_rank_s)  # its input pipeline is slow
        x = torch.randn(ROWS, WIDTH, generator=gen)
        target = torch.randn(ROWS, WIDTH, generator=gen)
        opt.zero_grad()
        if last:
            losses: list[torch.Tensor] = []
            schedule.step(target=target, losses=losses)
            loss = torch.stack(losses).mean().detach().reshape(1)
            time.sleep(SLOW_MS / 1e3)  # the last stage scores the outputs
        else:
            schedule.step(x)
            loss = torch.zeros(1)
        for p in part.parameters():  # data parallel: average the stage's gradients
            dist.all_reduce(p.grad, group=dp)
            p.grad /= dp.size()
        dist.all_reduce(loss)  # the loss, logged on every rank
        opt.step()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
