"""Small pieces the reference trainers and the reproducers share."""

from __future__ import annotations

import gc

import torch
import torch.distributed as dist


def ddp(model: torch.nn.Module, device: torch.device) -> torch.nn.Module:
    """``model`` on ``device``, wrapped in DDP (on a GPU, DDP's buckets live on that GPU)."""
    model = model.to(device)
    if device.type == "cuda":
        return torch.nn.parallel.DistributedDataParallel(model, device_ids=[device.index])
    return torch.nn.parallel.DistributedDataParallel(model)


def release(model: torch.nn.Module) -> None:
    """Free a DDP model now. Its reducer holds the process group: left for the interpreter's
    teardown (DDP sits in reference cycles), it outlives destroy_process_group and gloo's threads
    can abort the process on exit ("terminate called without an active exception")."""
    model.__dict__.pop("reducer", None)
    del model
    gc.collect()


def print_metrics(step: int, metrics: dict[str, float]) -> None:
    """Rank 0 prints a step's gathered metrics as Trainer's dict lines (0-based ``step``)."""
    if dist.get_rank() == 0:
        print({"step": step + 1, **{k: round(v, 4) for k, v in metrics.items()}}, flush=True)
