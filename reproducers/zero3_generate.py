"""docs/bugs.md E: ZeRO-3 ``generate`` hangs in ``_ALLGATHER_BASE`` (OpenRLHF #427; transformers
#22231 / #22242).

What happens: under ZeRO-3 every forward all-gathers the sharded weights first. Each rank decodes
until its own sequence ends, so ranks run different numbers of forwards: the rank that finishes
first goes on (here: to reduce the loss) while its peer waits in the all-gather of its next decode
step. ``--fixed`` is ``generate(synced_gpus=True)``: finished ranks keep doing dummy forwards until
an all-reduce of "still decoding" says every rank is done.

    torchrun --nproc-per-node 2 -m nccl_doctor.reproducers.zero3_generate [--fixed] [--device cuda]
"""

from __future__ import annotations

import argparse

import torch
import torch.distributed as dist

from nccl_doctor.trainers import placement

VOCAB = 11


def forward(shard: torch.Tensor, token: int) -> int:
    """One decode step of a sharded model: gather the full weights, then compute."""
    full = [torch.empty_like(shard) for _ in range(dist.get_world_size())]
    dist.all_gather(full, shard)  # ZeRO-3: parameters are gathered before every forward
    return int((torch.cat(full).sum() + token) % VOCAB)


def generate(shard: torch.Tensor, prompt: int, length: int, synced: bool) -> list[int]:
    tokens, token, step = [], prompt, 0
    while True:
        done = step >= length
        if synced:  # synced_gpus: all ranks step together until none is still decoding
            unfinished = torch.tensor([0.0 if done else 1.0], device=shard.device)
            dist.all_reduce(unfinished)
            if unfinished.item() == 0:
                return tokens
        elif done:
            return tokens
        token = forward(shard, token)  # a finished rank's dummy forward keeps its peers going
        if not done:
            tokens.append(token)
        step += 1


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--fixed", action="store_true", help="synced_gpus: step together")
    p.add_argument("--steps", type=int, default=2)
    placement.add_options(p)
    args = p.parse_args(argv)
    device = placement.init(p, args)
    rank = dist.get_rank()
    shard = torch.arange(8, dtype=torch.float32, device=device) + 8 * rank
    for step in range(args.steps):
        # each rank decodes until its own EOS: lengths differ once prompts do
        length = 3 + (rank if step > 0 else 0)
        tokens = generate(shard, prompt=step, length=length, synced=args.fixed)
        loss = torch.tensor([float(len(tokens))], device=device)
        dist.all_reduce(loss)
        if rank == 0:
            print(f"step {step + 1}: decoded {len(tokens)} tokens", flush=True)
    dist.barrier()  # accelerator.wait_for_everyone()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
