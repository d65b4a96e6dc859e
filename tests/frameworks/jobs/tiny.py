"""What the jobs share, as a user's script would have it: a tiny random Llama built from a config
(no hub: nothing is downloaded), rows of token ids, and a clean end."""

from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("WANDB_DISABLED", "true")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

VOCAB = 64


def model():
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)  # the same weights on every rank
    return LlamaForCausalLM(LlamaConfig(
        vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
        pad_token_id=0, bos_token_id=1, eos_token_id=2))


def rows(n: int = 32, length: int = 8):
    """A causal-LM data set of ``n`` rows of ``length`` token ids (labels = inputs)."""
    import torch

    class Rows(torch.utils.data.Dataset):
        def __len__(self) -> int:
            return n

        def __getitem__(self, i: int) -> dict:
            ids = torch.tensor([(i + j) % (VOCAB - 4) + 4 for j in range(length)])
            return {"input_ids": ids, "labels": ids}

    return Rows()


def output_dir() -> str:
    import tempfile

    return tempfile.mkdtemp(prefix="nccl-doctor-frameworks-")


def end() -> None:
    """A clean end: every rank done, then the process group destroyed. Left to interpreter
    teardown, gloo's threads can abort a rank after its work finished ("terminate called
    without an active exception"), which nccl-doctor rightly reports as a crash."""
    import gc

    import torch.distributed as dist

    dist.barrier()
    gc.collect()
    dist.destroy_process_group()
