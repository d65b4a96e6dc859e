"""docs/bugs.md A on the real TRL (0.14-0.16; TRL #3068): CPOTrainer, 2 ranks, gloo on the CPU.

Each rank pads its batch to its own longest sequence, and TRL's get_batch_loss_metrics gathers
the [B, T, V] logits with accelerator.gather_for_metrics: T differs across ranks, so the gather
does not match (gloo aborts the rank receiving the larger message; NCCL would hang). The
examples all differ in length, so any two ranks' batches do. Run it with torchrun
--nproc-per-node 2 in an environment with TRL 0.16.1 (tests/upstream/envs.py).
"""

from tiny import model, output_dir, tokenizer, words


def data():
    from datasets import Dataset

    rows = [{"prompt": words(2 + i % 3, i), "chosen": words(3 + 2 * i, i + 1),
             "rejected": words(2 + i, i + 2)} for i in range(16)]
    return Dataset.from_list(rows)


def main() -> None:
    from trl import CPOConfig, CPOTrainer

    args = CPOConfig(
        output_dir=output_dir(), per_device_train_batch_size=1, max_steps=3, max_length=64,
        max_prompt_length=16, report_to="none", use_cpu=True, logging_steps=1,
        save_strategy="no", dataloader_num_workers=0, seed=0)
    trainer = CPOTrainer(model=model(), args=args, train_dataset=data(),
                         processing_class=tokenizer())
    trainer.train()


if __name__ == "__main__":
    main()
