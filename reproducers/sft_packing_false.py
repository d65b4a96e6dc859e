"""docs/bugs.md B: SFT with ``packing=False`` hangs at the start (TRL #2879, fixed by #2890, v0.15.1).

What happens: TRL 0.15.0's ``SFTTrainer.compute_loss`` gathered ``shift_logits`` ``[B, T-1, V]``
and ``shift_labels`` for its token-accuracy metric, in the forward pass, before any DDP
all-reduce. Without packing each rank pads its batch to its own longest sequence, so the sizes
differ at the very first step. With packing every row has the same length: no hang.

On NCCL the size-mismatched all-gather hangs; the rank with the smaller tensor finishes and goes
on into DDP's gradient all-reduce (issued from C++: only Flight Recorder sees it). On gloo the
tensors are gathered one time step at a time, which behaves the same way (a size mismatch in one
call would abort instead). ``--packing`` is the control; ``--fixed`` computes correct/total
token counts locally and all-reduces the two numbers, as TRL's fix does.

    torchrun --nproc-per-node 2 -m nccl_doctor.reproducers.sft_packing_false [--packing|--fixed]
        [--device cuda]
"""

from __future__ import annotations

import argparse

import torch
import torch.distributed as dist
import torch.nn.functional as F

from nccl_doctor.trainers import placement, tiny
from nccl_doctor.trainers.common import ddp, release

PACKED_LENGTH = 16


def batch_for(rank: int, step: int, size: int, packing: bool, tok) -> torch.Tensor:
    """Token ids ``[size, T]``: padded to this rank's longest text, or packed to a fixed T."""
    texts = [p.prompt + " " + p.chosen for p in tiny.preference_data(64, seed=step)]
    mine = texts[rank * size:(rank + 1) * size]
    rows = [[tiny.BOS] + tok(t, add_special_tokens=False)["input_ids"] + [tiny.EOS]
            for t in mine]
    if packing:  # concatenate, then cut into rows of one length: the same T on every rank
        stream = [t for r in rows for t in r] * 4
        return torch.tensor(stream[:size * PACKED_LENGTH]).view(size, PACKED_LENGTH)
    width = max(len(r) for r in rows)  # the bug's precondition: per-rank padding
    ids = torch.full((size, width), tiny.PAD, dtype=torch.long)
    for i, r in enumerate(rows):
        ids[i, :len(r)] = torch.tensor(r)
    return ids


def gather(chunk: torch.Tensor) -> torch.Tensor:
    parts = [torch.empty_like(chunk) for _ in range(dist.get_world_size())]
    dist.all_gather(parts, chunk.contiguous())
    return torch.cat(parts)


def gather_steps(logits: torch.Tensor, labels: torch.Tensor) -> list[tuple]:
    """``gather(logits), gather(labels)`` with NCCL's behaviour on a size mismatch: one time
    step at a time, so the rank with the shorter T simply finishes first."""
    return [(gather(logits[:, s:s + 1]), gather(labels[:, s:s + 1]))
            for s in range(logits.shape[1])]


def token_accuracy(logits: torch.Tensor, labels: torch.Tensor, fixed: bool) -> float:
    mask = labels != tiny.PAD
    if fixed:  # TRL #2890: count locally, reduce two numbers
        correct = ((logits.argmax(-1) == labels) & mask).sum()
        counts = torch.stack([correct, mask.sum()]).float()
        dist.all_reduce(counts)
        return (counts[0] / counts[1].clamp(min=1)).item()
    # TRL 0.15.0: gather the per-rank-padded logits and labels
    steps = gather_steps(logits.detach(), labels)
    correct = sum(((lg.argmax(-1) == lb) & (lb != tiny.PAD)).sum().item() for lg, lb in steps)
    total = sum((lb != tiny.PAD).sum().item() for _, lb in steps)
    return correct / max(total, 1)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--packing", action="store_true", help="pack rows to one length (control)")
    p.add_argument("--fixed", action="store_true", help="reduce correct/total counts (#2890)")
    p.add_argument("--steps", type=int, default=2)
    p.add_argument("--batch", type=int, default=2)
    placement.add_options(p)
    args = p.parse_args(argv)
    device = placement.init(p, args)
    rank = dist.get_rank()
    tok = tiny.tokenizer()
    model = ddp(tiny.model(0), device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    for step in range(args.steps):
        ids = batch_for(rank, step, args.batch, args.packing, tok).to(device)
        logits = model(input_ids=ids, attention_mask=(ids != tiny.PAD).long()).logits
        shift_logits, shift_labels = logits[:, :-1], ids[:, 1:]
        loss = F.cross_entropy(shift_logits.reshape(-1, shift_logits.shape[-1]),
                               shift_labels.reshape(-1), ignore_index=tiny.PAD)
        accuracy = token_accuracy(shift_logits, shift_labels, args.fixed)  # in the forward
        optimizer.zero_grad()
        loss.backward()  # DDP's gradient all_reduce, issued from C++
        optimizer.step()
        if rank == 0:
            print(f"step {step + 1}: loss {loss.item():.4f}, token accuracy {accuracy:.3f}",
                  flush=True)
    release(model)
    dist.barrier()  # accelerator.wait_for_everyone()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
