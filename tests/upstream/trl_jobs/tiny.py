"""What the TRL jobs share, as a user's script would have it: a tiny random Llama built from a
config and a word-level tokenizer built in code (no hub: nothing is downloaded)."""

from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("WANDB_DISABLED", "true")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

SPECIALS = ["<pad>", "<s>", "</s>", "<unk>"]
WORDS = [f"w{i}" for i in range(60)]  # a vocabulary of 64


def tokenizer():
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {t: i for i, t in enumerate(SPECIALS + WORDS)}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    out = PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", bos_token="<s>",
                                  eos_token="</s>", unk_token="<unk>")
    # a chat template, for the trainers that apply one to conversational data
    out.chat_template = ("{% for m in messages %}{{ m['content'] }} {% endfor %}"
                         "{% if add_generation_prompt %}{% endif %}")
    return out


def model():
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)  # the same weights on every rank
    return LlamaForCausalLM(LlamaConfig(
        vocab_size=len(SPECIALS) + len(WORDS), hidden_size=32, intermediate_size=64,
        num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
        max_position_embeddings=256, pad_token_id=0, bos_token_id=1, eos_token_id=2))


def words(n: int, offset: int = 0) -> str:
    return " ".join(WORDS[(offset + i) % len(WORDS)] for i in range(n))


def output_dir() -> str:
    import tempfile

    return tempfile.mkdtemp(prefix="nccl-doctor-trl-")


def end(trainer) -> None:
    """A clean end: every rank done, the DDP wrapper that holds the process group freed, then
    the group destroyed. Left to interpreter teardown, gloo's threads can abort a rank after its
    work finished ("terminate called without an active exception")."""
    import gc

    import torch.distributed as dist

    trainer.accelerator.wait_for_everyone()
    del trainer
    gc.collect()
    dist.destroy_process_group()
