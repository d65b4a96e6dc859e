"""DPO, CPO, SimPO and ORPO on the tiny model, with DDP, as the TRL trainers do them (gloo on CPU;
NCCL with ``--device cuda``).

Each rank takes its own slice of the data and pads it to *its own* longest sequence (so ``T``
differs between ranks, as in every real trainer); the loss is the paper's (nccl_doctor.trainers.
losses); DDP all-reduces the gradients from C++; then the metrics are gathered the way TRL's
``get_batch_loss_metrics`` does: six per-example ``[B]`` gathers, the logits summary, the loss.

``gather_logits="whole"`` gathers the full ``[B, T, V]`` logits instead of their mean (TRL v0.14
to v0.16, docs/bugs.md A): the shapes differ across ranks, and gloo aborts (NCCL hangs).
``"chunked"`` gathers them one ``[B, 1, V]`` time step at a time, which gives gloo NCCL's
semantics for that bug: the rank with the shorter ``T`` finishes first and goes on to reduce the
loss while its peer waits for the next chunk - a hang, not an abort. Run it with torchrun:

    torchrun --nproc-per-node 2 -m nccl_doctor.trainers.preference --method cpo [--device cuda]
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from typing import Callable

import torch
import torch.distributed as dist

from nccl_doctor.trainers import losses, placement, tiny
from nccl_doctor.trainers.common import ddp, print_metrics, release

METHODS = ("dpo", "cpo", "simpo", "orpo")
METRICS = ("rewards/chosen", "rewards/rejected", "rewards/accuracies", "rewards/margins",
           "logps/chosen", "logps/rejected")


@dataclass
class Batch:
    input_ids: torch.Tensor  # [2B, T_rank]: the B chosen sequences, then the B rejected ones
    attention_mask: torch.Tensor  # [2B, T_rank]
    response_mask: torch.Tensor  # [2B, T_rank]: 1 on the response tokens
    lengths: torch.Tensor  # [2B]: response lengths

    @property
    def size(self) -> int:
        return self.input_ids.shape[0] // 2

    def to(self, device: torch.device) -> "Batch":
        return Batch(*(t.to(device) for t in (self.input_ids, self.attention_mask,
                                               self.response_mask, self.lengths)))


def collate(examples: list[tiny.Preference], tok) -> Batch:
    """prompt+chosen and prompt+rejected, right-padded to this rank's longest sequence."""
    rows, masks = [], []
    for which in ("chosen", "rejected"):
        for ex in examples:
            prompt = tok(ex.prompt, add_special_tokens=False)["input_ids"]
            response = tok(getattr(ex, which), add_special_tokens=False)["input_ids"]
            rows.append([tiny.BOS] + prompt + response + [tiny.EOS])
            masks.append([0] * (1 + len(prompt)) + [1] * (len(response) + 1))
    width = max(len(r) for r in rows)
    ids = torch.full((len(rows), width), tiny.PAD, dtype=torch.long)
    attention = torch.zeros_like(ids)
    response = torch.zeros_like(ids)
    for i, (r, m) in enumerate(zip(rows, masks)):
        ids[i, :len(r)] = torch.tensor(r)
        attention[i, :len(r)] = 1
        response[i, :len(m)] = torch.tensor(m)
    return Batch(ids, attention, response, response.sum(dim=1))


def sequence_logps(logits: torch.Tensor, batch: Batch) -> torch.Tensor:
    """Summed log-probabilities of each sequence's response tokens ([2B])."""
    logp = torch.log_softmax(logits[:, :-1].float(), dim=-1)
    targets = batch.input_ids[:, 1:]
    token = torch.gather(logp, 2, targets.unsqueeze(-1)).squeeze(-1)
    return (token * batch.response_mask[:, 1:]).sum(dim=1)


def loss_of(method: str, logp: torch.Tensor, ref: torch.Tensor | None, batch: Batch):
    b = batch.size
    w, lo = logp[:b], logp[b:]
    nw, nl = batch.lengths[:b].float(), batch.lengths[b:].float()
    if method == "dpo":
        assert ref is not None
        return losses.dpo(w, lo, ref[:b], ref[b:])
    if method == "cpo":
        return losses.cpo(w, lo, nw)
    if method == "simpo":
        return losses.simpo(w, lo, nw, nl)
    if method == "orpo":
        return losses.orpo(w, lo, nw, nl)
    raise ValueError(f"unknown method {method!r}: one of {', '.join(METHODS)}")


def gather_mean(t: torch.Tensor) -> float:
    """``accelerator.gather_for_metrics(t).mean()``: all_gather, then the mean."""
    out = [torch.empty_like(t) for _ in range(dist.get_world_size())]
    dist.all_gather(out, t.contiguous())
    return torch.cat([o.reshape(-1) for o in out]).float().mean().item()


GATHERS = ("scalar", "whole", "chunked")


def train(method: str, *, steps: int = 3, batch: int = 2, lr: float = 1e-3, seed: int = 0,
          gather_logits: str = "scalar",
          on_step: Callable[[int, dict[str, float]], None] | None = None,
          device: torch.device | None = None) -> list[dict]:
    """Train for ``steps`` steps on ``device`` (the CPU by default); returns the gathered metrics
    of each step. The process group must exist (torchrun)."""
    device = device or torch.device("cpu")
    if method not in METHODS:
        raise ValueError(f"unknown method {method!r}: one of {', '.join(METHODS)}")
    if gather_logits not in GATHERS:
        raise ValueError(f"unknown gather {gather_logits!r}: one of {', '.join(GATHERS)}")
    rank, world = dist.get_rank(), dist.get_world_size()
    tok = tiny.tokenizer()
    model = ddp(tiny.model(seed), device)
    ref = tiny.model(seed).to(device).eval() if method == "dpo" else None
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr)
    data = tiny.preference_data(steps * batch * world, seed=seed + 1)
    history = []
    for step in range(steps):
        start = (step * world + rank) * batch
        b = collate(data[start:start + batch], tok).to(device)
        logits = model(input_ids=b.input_ids, attention_mask=b.attention_mask).logits
        logp = sequence_logps(logits, b)
        ref_logp = None
        if ref is not None:
            with torch.no_grad():
                ref_logp = sequence_logps(ref(input_ids=b.input_ids,
                                              attention_mask=b.attention_mask).logits, b)
        loss, rw, rl = loss_of(method, logp, ref_logp, b)
        optimizer.zero_grad()
        loss.backward()  # DDP's gradient all_reduce, issued from C++
        optimizer.step()
        n = b.size
        per_example = {
            "rewards/chosen": rw, "rewards/rejected": rl,
            "rewards/accuracies": (rw > rl).float(), "rewards/margins": rw - rl,
            "logps/chosen": logp[:n].detach(), "logps/rejected": logp[n:].detach(),
        }
        metrics = {name: gather_mean(per_example[name]) for name in METRICS}
        chosen_logits = logits[:n].detach()
        if gather_logits == "whole":  # the bug: [B, T_rank, V] differs across ranks
            metrics["logits/chosen"] = gather_mean(chosen_logits)
        elif gather_logits == "chunked":  # the bug, with NCCL's semantics on gloo
            chunks = [gather_mean(chosen_logits[:, t:t + 1]) for t in
                      range(chosen_logits.shape[1])]
            metrics["logits/chosen"] = sum(chunks) / len(chunks)
        else:  # the fix: a reduced scalar has the same shape everywhere
            metrics["logits/chosen"] = gather_mean(chosen_logits.mean().reshape(1))
        reduced = loss.detach().reshape(1).clone()
        dist.all_reduce(reduced)  # accelerator.reduce(loss, "mean")
        metrics["loss"] = reduced.item() / world
        history.append(metrics)
        if on_step is not None:
            on_step(step, metrics)
    release(model)
    return history


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description="a reference preference trainer (tiny model)")
    p.add_argument("--method", choices=METHODS, default="dpo")
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--batch", type=int, default=2)
    p.add_argument("--gather-logits", choices=GATHERS, default="scalar",
                   help="how the logits are gathered for the metrics: their mean (scalar, "
                        "right), the full per-rank-padded tensor (whole: docs/bugs.md A, gloo "
                        "aborts), or per time step (chunked: docs/bugs.md A as NCCL hangs)")
    placement.add_options(p)
    args = p.parse_args(argv)
    device = placement.init(p, args)
    train(args.method, steps=args.steps, batch=args.batch, gather_logits=args.gather_logits,
          on_step=print_metrics, device=device)
    dist.barrier()  # accelerator.wait_for_everyone(): no rank tears down while a peer still talks
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
