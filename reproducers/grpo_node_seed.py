"""docs/bugs.md C: GRPO with identical completions inside each node (ms-swift #3745 / #3780).

What happens: sampling is seeded by something constant inside a node (here the node rank), not
by the global rank. GRPO places the G samples of a prompt on consecutive ranks - here the ranks of
one node - so the G samples are identical: reward std 0, advantages 0, loss 0, nothing learned.
Nothing hangs. ``--fixed`` seeds by global rank.

Four ranks on two simulated nodes (two torchrun agents on localhost, ``--nnodes 2``):

    python -m nccl_doctor.reproducers.nodes --nnodes 2 --nproc-per-node 2 \\
        -m nccl_doctor.reproducers.grpo_node_seed [--fixed] [--device cuda]
"""

from __future__ import annotations

import argparse
import os

import torch.distributed as dist

from nccl_doctor.trainers import grpo, placement
from nccl_doctor.trainers.common import print_metrics


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--fixed", action="store_true", help="seed sampling by global rank")
    p.add_argument("--steps", type=int, default=4)
    placement.add_options(p)
    args = p.parse_args(argv)
    device = placement.init(p, args)
    group = int(os.environ.get("LOCAL_WORLD_SIZE", dist.get_world_size()))

    grpo.train(steps=args.steps, group=group, seed_mode="rank" if args.fixed else "node",
               on_step=print_metrics, device=device)
    dist.barrier()  # accelerator.wait_for_everyone()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
