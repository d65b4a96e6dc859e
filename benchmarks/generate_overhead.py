"""Slowdown of transformers' ``generate`` with nccl-doctor's hook (RNG fingerprint before, a hash
per prompt and generated row after, one note into the capture).

One process, a gloo group of one, a tiny random Llama; rounds alternate between the original
``generate`` and the hooked one so that warm-up and drift fall on both alike. Prints the medians,
the hook's own cost per call and the ratio.

    python benchmarks/generate_overhead.py [--rounds 7] [--calls 20] [--batch 8] [--new-tokens 16]
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from pathlib import Path


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--calls", type=int, default=20)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--new-tokens", type=int, default=16)
    args = ap.parse_args()

    import nccl_doctor

    directory = Path(tempfile.mkdtemp(prefix="gen-bench-"))
    nccl_doctor.install(directory)
    import torch
    import torch.distributed as dist
    from transformers import LlamaConfig, LlamaForCausalLM
    from transformers.generation.utils import GenerationMixin

    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29581")
    dist.init_process_group("gloo", rank=0, world_size=1)
    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(
        vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128,
        pad_token_id=0, bos_token_id=1, eos_token_id=2)).eval()
    prompts = torch.randint(3, 256, (args.batch, 12))
    hooked = GenerationMixin.generate
    original = getattr(hooked, "__wrapped__", None)
    if original is None:
        raise SystemExit("the generate hook is not installed: nothing to compare")

    def timed(fn) -> float:
        GenerationMixin.generate = fn
        t0 = time.perf_counter()
        with torch.no_grad():
            for _ in range(args.calls):
                model.generate(prompts, attention_mask=torch.ones_like(prompts), do_sample=True,
                               max_new_tokens=args.new_tokens, pad_token_id=0)
        return (time.perf_counter() - t0) / args.calls

    timed(original), timed(hooked)  # warm-up
    bare, hook = [], []
    for _ in range(args.rounds):
        bare.append(timed(original))
        hook.append(timed(hooked))
    GenerationMixin.generate = hooked
    b, h = statistics.median(bare), statistics.median(hook)
    print(f"generate, batch {args.batch}, {args.new_tokens} new tokens, {args.calls} calls x "
          f"{args.rounds} rounds")
    print(f"  bare    {b * 1e3:8.2f} ms/call (median)")
    print(f"  hooked  {h * 1e3:8.2f} ms/call (median)")
    print(f"  hook    {(h - b) * 1e6:8.1f} us/call; ratio {h / b:.3f}")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
