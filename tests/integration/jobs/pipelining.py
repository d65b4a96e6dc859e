"""torch.distributed.pipelining on gloo: two stages, each a small MLP, and a schedule that runs
the microbatches (SCHEDULE: gpipe | 1f1b). With 4 ranks, 2 stages x 2 replicas: each replica's
stages talk over their own pipeline group and each stage's gradients are averaged over its
data-parallel group. SCENARIO picks one:

- healthy: every stage runs MICROBATCHES microbatches of the same shapes
- microbatches: the last stage's schedule is built with one microbatch fewer than the first's
- shape: the last stage is told its input is wider than what the first stage sends
"""
import os
from datetime import timedelta

import torch
import torch.distributed as dist
from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleGPipe

MICROBATCHES = 4
ROWS, WIDTH = 8, 6  # a batch, and the width between the stages
STEPS = 3
SCHEDULES = {"gpipe": ScheduleGPipe, "1f1b": Schedule1F1B}


def groups(rank: int, world: int) -> tuple[dist.ProcessGroup | None, dist.ProcessGroup | None,
                                            int]:
    """(this rank's pipeline group, its data-parallel group, its stage). Every rank makes every
    group, in the same order, as torch requires."""
    if world == 2:
        return None, None, rank
    pp = [dist.new_group([0, 1]), dist.new_group([2, 3])]
    dp = [dist.new_group([0, 2]), dist.new_group([1, 3])]
    return pp[rank // 2], dp[rank % 2], rank % 2


def main() -> None:
    dist.init_process_group("gloo", timeout=timedelta(seconds=60))
    rank, world = dist.get_rank(), dist.get_world_size()
    scenario = os.environ.get("SCENARIO", "healthy")
    pp_group, dp_group, stage_index = groups(rank, world)
    torch.manual_seed(stage_index)
    module = torch.nn.Sequential(torch.nn.Linear(WIDTH, WIDTH), torch.nn.ReLU())
    last = stage_index == 1
    micro = MICROBATCHES - 1 if scenario == "microbatches" and last else MICROBATCHES
    mb_rows = ROWS // MICROBATCHES
    width = WIDTH + 2 if scenario == "shape" and last else WIDTH
    stage = PipelineStage(module, stage_index, 2, torch.device("cpu"), group=pp_group,
                          input_args=torch.empty(mb_rows, width, requires_grad=stage_index > 0),
                          output_args=torch.empty(mb_rows, WIDTH, requires_grad=True))
    schedule = SCHEDULES[os.environ.get("SCHEDULE", "gpipe")](
        stage, n_microbatches=micro, loss_fn=lambda out, target: out.pow(2).mean())
    optimizer = torch.optim.SGD(module.parameters(), lr=0.01)
    for step in range(STEPS):
        optimizer.zero_grad()
        if stage_index == 0:
            schedule.step(torch.randn(ROWS, WIDTH))
        else:
            schedule.step(target=torch.zeros(ROWS, WIDTH))
        if dp_group is not None:  # the replicas' gradients, averaged per stage
            for p in module.parameters():
                dist.all_reduce(p.grad, group=dp_group)
        optimizer.step()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
