"""DeepSpeed ZeRO-3: ``generate`` without ``synced_gpus``, each rank decoding its own length.

Under ZeRO-3 every forward all-gathers the partitioned parameters. Rank r decodes 4 + 3r tokens
(as ranks do when their prompts end at different EOS steps): rank 0 finishes first and goes on
to the barrier while rank 1 waits in the all-gather of its next decode step, and the job hangs
(docs/bugs.md E). The config gathers every parameter at every step (no persistence, no
prefetch, nothing kept live), as a model too large to keep gathered is run; with DeepSpeed's
defaults this tiny model's parameters stay gathered after the first step and nothing hangs.
``--fixed`` is ``synced_gpus=True``: a finished rank keeps stepping until every rank is done.

    DS_ACCELERATOR=cpu torchrun --nproc-per-node 2 ds_generate.py [--fixed]
"""

import argparse
import os

import deepspeed
import torch
import torch.distributed as dist
from tiny import model

CONFIG = {
    "train_micro_batch_size_per_gpu": 1,
    "zero_optimization": {
        "stage": 3, "stage3_param_persistence_threshold": 0, "stage3_max_live_parameters": 0,
        "stage3_max_reuse_distance": 0, "stage3_prefetch_bucket_size": 0},
}


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--fixed", action="store_true")
    args = parser.parse_args()
    deepspeed.init_distributed(dist_backend="gloo")
    rank = int(os.environ["RANK"])
    engine, *_ = deepspeed.initialize(model=model(), config=CONFIG)
    engine.module.eval()
    prompt = torch.tensor([[1, 5, 6, 7]])
    length = 4 + 3 * rank
    with torch.no_grad():
        out = engine.module.generate(prompt, max_new_tokens=length, min_new_tokens=length,
                                     do_sample=False, synced_gpus=args.fixed)
    print(rank, out.shape)
    dist.barrier()  # then save, evaluate, ...
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
