"""GRPO on the tiny model with DDP (gloo; NCCL with ``--device cuda``): G samples per prompt.

Ranks ``g*G .. g*G+G-1`` sample the same prompt (as GRPO trainers place a prompt's samples on
consecutive ranks); each samples one completion, the rewards are all-gathered, each group's
advantages computed (nccl_doctor.trainers.losses.grpo_advantages) and every rank takes its own
sample's clipped-surrogate loss. The metrics a GRPO trainer logs (reward, reward_std, loss) are
gathered, printed like Trainer's dict lines and recorded (``nccl_doctor.observe_metrics``).

``--seed-mode`` picks how sampling is seeded: ``rank`` (right: seed + global rank), ``node``
(seed + node rank, as in docs/bugs.md C: identical samples inside a node), ``same`` (one seed).

    torchrun --nproc-per-node 2 -m nccl_doctor.trainers.grpo --steps 3 [--device cuda]
"""

from __future__ import annotations

import argparse
import os
from typing import Callable

import torch
import torch.distributed as dist

import nccl_doctor
from nccl_doctor.trainers import losses, placement, tiny
from nccl_doctor.trainers.common import ddp, print_metrics, release

SEED_MODES = ("rank", "node", "same")


def reward(tokens: list[int]) -> float:
    """A reward that varies with the sample (any non-constant one would do): the share of
    distinct tokens, plus 0.1 per token id divisible by 3."""
    return len(set(tokens)) / max(len(tokens), 1) + 0.1 * sum(1 for t in tokens if t % 3 == 0)


def sampling_seed(mode: str, seed: int, rank: int) -> int:
    if mode == "rank":
        return seed + rank
    if mode == "node":  # docs/bugs.md C: constant inside a node
        return seed + int(os.environ.get("GROUP_RANK", os.environ.get("NODE_RANK", "0")))
    if mode == "same":
        return seed
    raise ValueError(f"unknown seed mode {mode!r}: one of {', '.join(SEED_MODES)}")


def completion_logps(model, ids: torch.Tensor, prompt_len: int) -> torch.Tensor:
    """Per-token log-probabilities of the completion part of ``ids`` ([1, T - prompt_len])."""
    logits = model(input_ids=ids).logits[:, :-1]
    logp = torch.log_softmax(logits.float(), dim=-1)
    token = torch.gather(logp, 2, ids[:, 1:].unsqueeze(-1)).squeeze(-1)
    return token[:, prompt_len - 1:]


def train(*, steps: int = 3, group: int | None = None, seed_mode: str = "rank",
          seed: int = 1234, max_new_tokens: int = 8, lr: float = 1e-3,
          on_step: Callable[[int, dict[str, float]], None] | None = None,
          device: torch.device | None = None) -> list[dict]:
    """Train for ``steps`` steps on ``device`` (the CPU by default); returns the gathered metrics
    of each step. The process group must exist (torchrun)."""
    device = device or torch.device("cpu")
    rank, world = dist.get_rank(), dist.get_world_size()
    g = group or world
    if world % g:
        raise ValueError(f"world size {world} is not a multiple of the group size {g}")
    tok = tiny.tokenizer()
    model = ddp(tiny.model(0), device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr)
    prompts = tiny.prompts(steps * (world // g), seed=seed)
    torch.manual_seed(sampling_seed(seed_mode, seed, rank))
    history = []
    for step in range(steps):
        prompt = prompts[step * (world // g) + rank // g]
        ids = torch.tensor([[tiny.BOS] + tok(prompt, add_special_tokens=False)["input_ids"]],
                           device=device)
        with torch.no_grad():
            out = model.module.generate(ids, attention_mask=torch.ones_like(ids), do_sample=True,
                                        top_k=0, max_new_tokens=max_new_tokens,
                                        pad_token_id=tiny.PAD, eos_token_id=None)
        sample = out[0, ids.shape[1]:].tolist()
        rewards = [torch.zeros(1, device=device) for _ in range(world)]
        dist.all_gather(rewards, torch.tensor([reward(sample)], device=device))
        advantages, stds = losses.grpo_advantages(torch.cat(rewards), g)
        logp = completion_logps(model, out, ids.shape[1])
        loss = losses.grpo(logp, logp.detach(), advantages[rank:rank + 1],
                           torch.ones_like(logp))
        optimizer.zero_grad()
        loss.backward()  # DDP's gradient all_reduce
        optimizer.step()
        gathered = [torch.zeros(1, device=device) for _ in range(world)]
        dist.all_gather(gathered, loss.detach().reshape(1))
        metrics = {"loss": round(torch.cat(gathered).mean().item(), 4),
                   "reward": torch.cat(rewards).mean().item(),
                   "reward_std": stds.mean().item()}
        history.append(metrics)
        nccl_doctor.observe_metrics(step + 1, metrics)
        if on_step is not None:
            on_step(step, metrics)
    release(model)
    return history


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description="a reference GRPO trainer (tiny model)")
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--group", type=int, default=None,
                   help="samples per prompt, on consecutive ranks (default: the world size)")
    p.add_argument("--seed-mode", choices=SEED_MODES, default="rank")
    placement.add_options(p)
    args = p.parse_args(argv)
    device = placement.init(p, args)

    train(steps=args.steps, group=args.group, seed_mode=args.seed_mode, on_step=print_metrics,
          device=device)
    dist.barrier()  # accelerator.wait_for_everyone(): no rank tears down while a peer still talks
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
