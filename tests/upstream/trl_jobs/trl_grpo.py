"""A healthy GRPO run on the current TRL (2 ranks, gloo on the CPU; each rank samples with its
own seed, as TRL seeds them), ended cleanly (tiny.end). Nothing may be reported: no seed
warning, no straggler, no degenerate signal."""

from tiny import end, model, output_dir, tokenizer, words


def reward_distinct(completions, **_kwargs):
    return [float(len(set(c.split()))) for c in completions]


def main() -> None:
    from datasets import Dataset
    from trl import GRPOConfig, GRPOTrainer

    tok = tokenizer()
    tok.padding_side = "left"
    args = GRPOConfig(
        output_dir=output_dir(), per_device_train_batch_size=2, num_generations=2,
        max_completion_length=8, max_steps=3, logging_steps=1, learning_rate=1e-3,
        report_to="none", save_strategy="no", use_cpu=True, seed=42, beta=0.0,
        dataloader_num_workers=0, disable_tqdm=True)
    prompts = [words(4, 7 * i) for i in range(16)]
    trainer = GRPOTrainer(model=model(), reward_funcs=reward_distinct, args=args,
                          train_dataset=Dataset.from_dict({"prompt": prompts}),
                          processing_class=tok)
    trainer.train()
    end(trainer)


if __name__ == "__main__":
    main()
