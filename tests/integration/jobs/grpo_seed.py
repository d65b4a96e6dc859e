"""A real TRL GRPOTrainer run on CPU (gloo): a tiny randomly initialised Llama built from a
config, an offline word-level tokenizer, and a reward that varies with the completion.

The G=2 samples of each prompt are spread across the 2 ranks (per_device_train_batch_size=1,
num_generations=2). SEED_MODE=same forces every rank onto one seed after TRL's own
set_seed(seed, device_specific=True), as docs/bugs.md C's node-level seeding did; SEED_MODE=trl keeps
TRL's seeding. Run with torchrun --nproc-per-node 2."""

import gc
import os
import sys
import tempfile

import torch.distributed
import transformers
from datasets import Dataset
from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast
from trl import GRPOConfig, GRPOTrainer

WORDS = [f"w{i}" for i in range(60)]


def tokenizer() -> PreTrainedTokenizerFast:
    vocab = {"<pad>": 0, "<s>": 1, "</s>": 2, "<unk>": 3}
    vocab.update({w: i + 4 for i, w in enumerate(WORDS)})
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    return PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", bos_token="<s>",
                                   eos_token="</s>", unk_token="<unk>", padding_side="left")


def reward_distinct(completions, **_kwargs):
    return [float(len(set(c.split()))) for c in completions]


def main() -> None:
    # (TRL writes nothing here, save_strategy="no", but wants a directory: one removed after)
    with tempfile.TemporaryDirectory(prefix="grpo-", ignore_cleanup_errors=True) as out:
        train(out)


def train(output_dir: str) -> None:
    mode = os.environ.get("SEED_MODE", "trl")
    tok = tokenizer()
    config = LlamaConfig(vocab_size=len(WORDS) + 4, hidden_size=32, intermediate_size=64,
                         num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                         max_position_embeddings=64, pad_token_id=0, bos_token_id=1,
                         eos_token_id=2)
    transformers.set_seed(0)
    model = LlamaForCausalLM(config)
    prompts = [" ".join(WORDS[(7 * i + j) % 60] for j in range(4)) for i in range(16)]
    args = GRPOConfig(
        output_dir=output_dir, per_device_train_batch_size=1,
        num_generations=2, max_completion_length=8, max_steps=int(os.environ.get("STEPS", "4")),
        logging_steps=1, learning_rate=1e-3, report_to="none", save_strategy="no", use_cpu=True,
        seed=42, beta=0.0, temperature=1.0, dataloader_num_workers=0, disable_tqdm=True,
    )
    trainer = GRPOTrainer(model=model, reward_funcs=reward_distinct, args=args,
                          train_dataset=Dataset.from_dict({"prompt": prompts}),
                          processing_class=tok)
    if mode == "same":
        transformers.set_seed(args.seed)  # the bug: one seed on every rank
    trainer.train()
    if trainer.accelerator.is_main_process:
        print("GRPO-TRAINING-FINISHED", file=sys.stderr, flush=True)
    # a clean end, as a training script should: every rank done, the DDP wrapper (which holds
    # the process group) freed, then the group destroyed. Left to interpreter teardown, gloo's
    # threads can abort a rank whose peer has already exited.
    trainer.accelerator.wait_for_everyone()
    del trainer
    gc.collect()
    torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main()
