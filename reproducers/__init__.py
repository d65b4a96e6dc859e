"""Reproducers of the five upstream bugs of docs/bugs.md, one program per mechanism, each runnable
with torchrun on CPU (gloo) and each with ``--fixed``. ``nccl-doctor demo NAME`` runs one under the
doctor; ``REPRODUCERS`` says how."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Reproducer:
    name: str
    bug: str  # the letter in docs/bugs.md
    summary: str
    module: str
    nproc: int = 2  # ranks per node
    nnodes: int = 1  # simulated nodes (torchrun agents on localhost)
    variants: tuple[str, ...] = ()  # other variants: each is the reproducer's --NAME flag
    stuck_after: float | None = None  # demo's --stuck-after, unless the user gives one


REPRODUCERS: dict[str, Reproducer] = {r.name: r for r in (
    Reproducer("cpo_logits_gather", "A", "CPO gathers per-rank-padded logits: a hang at step 0",
               "nccl_doctor.reproducers.cpo_logits_gather", variants=("abort",)),
    Reproducer("sft_packing_false", "B", "SFT gathers padded logits for token accuracy: a hang",
               "nccl_doctor.reproducers.sft_packing_false", variants=("packing",)),
    Reproducer("grpo_node_seed", "C", "GRPO seeded by node: identical completions, loss 0",
               "nccl_doctor.reproducers.grpo_node_seed", nproc=2, nnodes=2),
    Reproducer("weight_sync_join", "D", "a weight-sync group a worker never joins: a stall",
               "nccl_doctor.reproducers.weight_sync_join", nproc=3, stuck_after=6.0),
    Reproducer("zero3_generate", "E", "ZeRO-3 sharded generate, unsynced lengths: a hang",
               "nccl_doctor.reproducers.zero3_generate"),
)}

#: the one a newcomer should see first
DEFAULT = "cpo_logits_gather"
