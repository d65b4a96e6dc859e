"""Ranks sampling through vLLM's offline API (the test stand-in: see tests/fixtures), with one
request seed on every rank (SEED_MODE=same) or a seed per rank (SEED_MODE=rank)."""

import os

import torch
import torch.distributed as dist

dist.init_process_group("gloo")
from vllm import LLM, SamplingParams  # noqa: E402  (imported after torch, as jobs do)

rank = dist.get_rank()
seed = 7 if os.environ.get("SEED_MODE", "same") == "same" else 7 + rank
llm = LLM()
for step in range(3):
    llm.generate([f"prompt {step} a", f"prompt {step} b"],
                 SamplingParams(temperature=1.0, seed=seed + 100 * step, n=2))
    dist.all_reduce(torch.ones(1))
dist.destroy_process_group()
