"""transformers ``Trainer``: a callback runs ``trainer.evaluate()`` on world process zero only.

``evaluate`` gathers every batch's logits across the ranks (``gather_for_metrics``): on process
zero alone it waits for ranks that went on training (their next collective is DDP's), and the
job hangs. ``--fixed`` evaluates on every rank.

    torchrun --nproc-per-node 2 hf_eval_on_main.py [--fixed]
"""

import argparse

from tiny import end, model, output_dir, rows
from transformers import Trainer, TrainerCallback, TrainingArguments


class EvaluateOnMain(TrainerCallback):
    """A mid-training evaluation, run by the main process (the mistake)."""

    def __init__(self):
        self.trainer = None

    def on_step_end(self, args, state, control, **kwargs):
        if state.global_step == 2 and state.is_world_process_zero:
            self.trainer.evaluate()


class EvaluateOnEveryRank(EvaluateOnMain):
    def on_step_end(self, args, state, control, **kwargs):
        if state.global_step == 2:
            self.trainer.evaluate()


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--fixed", action="store_true")
    cli = parser.parse_args()
    args = TrainingArguments(output_dir=output_dir(), per_device_train_batch_size=2, max_steps=4,
                             report_to="none", use_cpu=True, save_strategy="no",
                             dataloader_num_workers=0, disable_tqdm=True, logging_steps=100)
    callback = (EvaluateOnEveryRank if cli.fixed else EvaluateOnMain)()
    trainer = Trainer(model=model(), args=args, train_dataset=rows(), eval_dataset=rows(8),
                      callbacks=[callback])
    callback.trainer = trainer
    trainer.train()
    end()


if __name__ == "__main__":
    main()
