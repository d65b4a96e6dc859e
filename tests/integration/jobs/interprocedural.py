"""The branch on the rank read across calls (plain torch, gloo, 2 ranks): the value the branch
tests is the rank's only through another function. SCENARIO picks one; each ends with the ranks
in different collectives, except the decoy's, whose ranks part at a loop.

- argument: ``share(t, is_main=(rank == 0))``; in share, ``if is_main: all_reduce else:
  broadcast``
- helper_return: ``def is_main(): return dist.get_rank() == 0``; ``if is_main(): barrier()``
- attribute: ``self.is_main = dist.get_rank() == 0`` in ``__init__``; ``if self.is_main:`` in
  another method
- framework_property: a small class standing for accelerate's Accelerator, whose
  ``is_main_process`` property reads a field set from the rank; ``if acc.is_main_process:``
- decoy: ``share(t, is_main=(rank == 0))`` whose ``if is_main:`` only prints, the collective
  outside it; the ranks part because a loop's length read from the environment differs
- healthy: every rank makes the same calls
"""
import os
from datetime import timedelta

import torch
import torch.distributed as dist


def share(t, is_main):
    if is_main:
        dist.all_reduce(t)
    else:
        dist.broadcast(t, src=0)
    return t


def is_main():
    return dist.get_rank() == 0


class Worker:
    def __init__(self):
        self.is_main = dist.get_rank() == 0

    def step(self, t):
        if self.is_main:
            dist.broadcast(t, src=0)
        dist.all_reduce(torch.ones(3))


class TinyAccelerator:
    """Stands for accelerate's Accelerator: the flag is a property over the process state."""

    def __init__(self):
        self._index = dist.get_rank()

    @property
    def is_main_process(self):
        return self._index == 0

    def wait_for_everyone(self):
        dist.barrier()


def save(acc, t):
    if acc.is_main_process:
        acc.wait_for_everyone()
    dist.all_reduce(t)


def logged_share(t, is_main):
    if is_main:
        print("sharing", float(t.sum()), flush=True)
    dist.all_reduce(t)
    return t


def main() -> None:
    dist.init_process_group("gloo", timeout=timedelta(seconds=60))
    rank = dist.get_rank()
    scenario = os.environ["SCENARIO"]
    t = torch.ones(8)
    dist.all_reduce(t)  # every rank, in step
    if scenario == "argument":
        share(t, is_main=(rank == 0))
    elif scenario == "helper_return":
        if is_main():
            dist.barrier()
        dist.all_reduce(t)
    elif scenario == "attribute":
        Worker().step(t)
    elif scenario == "framework_property":
        save(TinyAccelerator(), t)
    elif scenario == "decoy":
        # the steps each rank runs, as a launcher's per-rank config would give them
        steps = int(os.environ.get("DECOY_STEPS_" + str(rank), "2"))
        for _ in range(steps):
            logged_share(t, is_main=(rank == 0))
        dist.barrier()
    else:
        dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
