"""Gather per-rank-padded logits, as TRL's CPO/SimPO/ORPO trainers did in v0.14-v0.16.

Each rank pads its batch to its *own* longest sequence, so the logits tensor ``[B, T_rank, V]`` has a
different ``T`` on each rank, and the all_gather of it cannot match. On NCCL that hangs with the GPUs
at 100%; on gloo the rank receiving the larger message aborts. Run it under the doctor:

    nccl-doctor run -- torchrun --nproc-per-node 2 -m nccl_doctor.examples.padded_gather \\
        [--device cuda]
"""

from __future__ import annotations

import argparse

import torch
import torch.distributed as dist

from nccl_doctor.trainers import placement

VOCAB = 32
BATCH = 2


def gather_metrics(logits: torch.Tensor, fixed: bool) -> torch.Tensor:
    world = dist.get_world_size()
    if fixed:  # the fix: gather a reduced scalar, whose shape is the same on every rank
        mean = logits.detach().mean().reshape(1)
        out = [torch.empty_like(mean) for _ in range(world)]
        dist.all_gather(out, mean)
        return torch.cat(out)
    out = [torch.empty_like(logits) for _ in range(world)]
    dist.all_gather(out, logits)  # the bug: T differs per rank
    return torch.cat(out, dim=1)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--fixed", action="store_true", help="gather logits.mean() instead")
    parser.add_argument("--steps", type=int, default=3)
    placement.add_options(parser)
    args = parser.parse_args()
    device = placement.init(parser, args)
    rank = dist.get_rank()
    torch.manual_seed(rank)
    for step in range(args.steps):
        # six small per-example metrics first, as the trainer logged them
        for _ in range(6):
            dist.all_reduce(torch.rand(BATCH, device=device))
        seq_len = 7 + 2 * rank + step  # each rank pads to its own longest sequence
        logits = torch.randn(BATCH, seq_len, VOCAB, device=device)
        gather_metrics(logits, args.fixed)
        if rank == 0:
            print(f"step {step}: gathered logits", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
