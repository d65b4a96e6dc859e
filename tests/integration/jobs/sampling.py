"""Every rank samples completions of the same prompts from a tiny randomly initialised causal LM
(built from a config: no download), STEPS times, an all_reduce between steps.

SEED_MODE: "same" - every rank calls transformers.set_seed(1234) (the seed bug);
"node" - seeded by node (GROUP_RANK), as in docs/bugs.md C; "rank" - seeded by global rank (right);
"greedy" - seeded alike but decoding greedily (identical outputs are expected)."""

import os

import torch
import torch.distributed as dist
import transformers
from transformers import LlamaConfig, LlamaForCausalLM


def main() -> None:
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    mode = os.environ.get("SEED_MODE", "same")
    node = int(os.environ.get("GROUP_RANK", "0"))
    torch.manual_seed(0)  # identical weights everywhere, as DDP needs
    config = LlamaConfig(vocab_size=96, hidden_size=32, intermediate_size=64,
                         num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                         max_position_embeddings=64, pad_token_id=0, bos_token_id=1,
                         eos_token_id=2)
    model = LlamaForCausalLM(config).eval()
    prompts = torch.randint(3, 96, (2, 6), generator=torch.Generator().manual_seed(7))
    seed = {"same": 1234, "greedy": 1234, "node": 1234 + node, "rank": 1234 + rank}[mode]
    transformers.set_seed(seed)
    for _ in range(int(os.environ.get("STEPS", "3"))):
        with torch.no_grad():
            out = model.generate(prompts, attention_mask=torch.ones_like(prompts),
                                 do_sample=mode != "greedy", max_new_tokens=8, top_k=0,
                                 eos_token_id=None, pad_token_id=0)
        dist.all_reduce(out.float().sum())
    print(f"rank {rank}: {out[0, 6:].tolist()}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
