"""A tiny causal LM and tokenizer, built offline: nothing is downloaded, everything is seeded."""

from __future__ import annotations

import random
from dataclasses import dataclass

#: the vocabulary: four specials, then plain words
SPECIALS = ("<pad>", "<s>", "</s>", "<unk>")
WORDS = tuple(f"w{i}" for i in range(92))
PAD, BOS, EOS = 0, 1, 2


def tokenizer():
    """A word-level ``PreTrainedTokenizerFast`` (``tokenizers``), left padding for generation."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {t: i for i, t in enumerate(SPECIALS + WORDS)}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    return PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", bos_token="<s>",
                                   eos_token="</s>", unk_token="<unk>", padding_side="left")


def model(seed: int = 0, *, layers: int = 2, hidden: int = 32):
    """A randomly initialised Llama with the same weights on every rank (``seed``)."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        vocab_size=len(SPECIALS) + len(WORDS), hidden_size=hidden, intermediate_size=2 * hidden,
        num_hidden_layers=layers, num_attention_heads=4, num_key_value_heads=2,
        max_position_embeddings=128, pad_token_id=PAD, bos_token_id=BOS, eos_token_id=EOS,
    )
    state = torch.random.get_rng_state()
    torch.manual_seed(seed)
    try:
        return LlamaForCausalLM(config)
    finally:
        torch.random.set_rng_state(state)  # building the model leaves the caller's RNG alone


@dataclass(frozen=True)
class Preference:
    prompt: str
    chosen: str
    rejected: str


def preference_data(n: int, seed: int = 0) -> list[Preference]:
    """``n`` preference triples of varying lengths (so ranks pad to different lengths)."""
    rng = random.Random(seed)

    def text(lo: int, hi: int) -> str:
        return " ".join(rng.choice(WORDS) for _ in range(rng.randint(lo, hi)))

    return [Preference(text(2, 6), text(1, 8), text(1, 8)) for _ in range(n)]


def prompts(n: int, seed: int = 0, length: int = 4) -> list[str]:
    rng = random.Random(seed)
    return [" ".join(rng.choice(WORDS) for _ in range(length)) for _ in range(n)]
