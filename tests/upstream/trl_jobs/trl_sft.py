"""docs/bugs.md B on the real TRL 0.15.0 (TRL #2879): SFTTrainer with packing=False, 2 ranks, gloo
on the CPU.

SFTTrainer.compute_loss gathers shift_logits [B, T_rank - 1, V] (and the labels) for its token
accuracy metric with accelerator.gather_for_metrics; without packing each rank pads to its own
length, so the gather does not match at the first step, in the forward pass. The texts all
differ in length, so any two ranks' batches do. Run it with torchrun --nproc-per-node 2 in an
environment with TRL 0.15.0 (tests/upstream/envs.py).
"""

from tiny import model, output_dir, tokenizer, words


def data():
    from datasets import Dataset

    return Dataset.from_list([{"text": words(4 + 3 * i, i)} for i in range(16)])


def main() -> None:
    from trl import SFTConfig, SFTTrainer

    args = SFTConfig(
        output_dir=output_dir(), per_device_train_batch_size=1, max_steps=3, packing=False,
        max_seq_length=64, dataset_text_field="text", report_to="none", use_cpu=True,
        logging_steps=1, save_strategy="no", dataloader_num_workers=0, seed=0)
    trainer = SFTTrainer(model=model(), args=args, train_dataset=data(),
                         processing_class=tokenizer())
    trainer.train()


if __name__ == "__main__":
    main()
