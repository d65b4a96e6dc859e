"""A healthy DPO run on the current TRL (2 ranks, gloo on the CPU), ended cleanly (tiny.end:
without it gloo's threads can abort a rank at interpreter teardown, which nccl-doctor reports as
such). Nothing may be reported."""

from tiny import end, model, output_dir, tokenizer, words


def data():
    from datasets import Dataset

    rows = [{"prompt": words(2 + i % 3, i), "chosen": words(3 + i % 5, i + 1),
             "rejected": words(2 + i % 4, i + 2)} for i in range(16)]
    return Dataset.from_list(rows)


def main() -> None:
    from trl import DPOConfig, DPOTrainer

    args = DPOConfig(
        output_dir=output_dir(), per_device_train_batch_size=2, max_steps=3, max_length=64,
        report_to="none", use_cpu=True, logging_steps=1, save_strategy="no",
        dataloader_num_workers=0, seed=0, disable_tqdm=True)
    trainer = DPOTrainer(model=model(), ref_model=model(), args=args, train_dataset=data(),
                         processing_class=tokenizer())
    trainer.train()
    end(trainer)


if __name__ == "__main__":
    main()
