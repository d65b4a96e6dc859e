"""Lightning DDP: a callback saves a checkpoint on the global zero rank only.

``Trainer.save_checkpoint`` is a collective: the strategy broadcasts the path and ends in a
barrier, whatever rank writes the file. Called on rank 0 only, rank 0 waits in that barrier while
the other ranks go on training (their next collective is Lightning's per-step broadcast), and the
job hangs. ``--fixed`` calls it on every rank, as Lightning's docs say (it writes on rank 0 only).

    torchrun --nproc-per-node 2 pl_checkpoint.py [--fixed]
"""

import argparse
import os
import tempfile

import lightning as L
import torch
from tiny import end
from torch.utils.data import DataLoader, TensorDataset


class Regression(L.LightningModule):
    def __init__(self):
        super().__init__()
        self.layer = torch.nn.Linear(8, 1)

    def training_step(self, batch, batch_idx):
        x, y = batch
        return torch.nn.functional.mse_loss(self.layer(x), y)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


class SaveOnMain(L.Callback):
    """A mid-epoch checkpoint, written by the main process (the mistake)."""

    def __init__(self, where):
        self.where = where

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        if batch_idx == 3 and trainer.is_global_zero:
            trainer.save_checkpoint(os.path.join(self.where, "step.ckpt"))


class SaveOnEveryRank(SaveOnMain):
    """The fix: every rank calls it; Lightning writes the file on rank 0 only."""

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        if batch_idx == 3:
            trainer.save_checkpoint(os.path.join(self.where, "step.ckpt"))


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--fixed", action="store_true")
    args = parser.parse_args()
    torch.manual_seed(0)
    rows = 32 * int(os.environ["WORLD_SIZE"])  # 8 batches of 4 on each rank
    data = TensorDataset(torch.randn(rows, 8), torch.randn(rows, 1))
    save = (SaveOnEveryRank if args.fixed else SaveOnMain)(tempfile.mkdtemp())
    trainer = L.Trainer(accelerator="cpu", devices=int(os.environ["WORLD_SIZE"]), strategy="ddp",
                        max_epochs=1, logger=False, enable_checkpointing=False,
                        enable_progress_bar=False, enable_model_summary=False, callbacks=[save])
    trainer.fit(Regression(), DataLoader(data, batch_size=4))
    end()


if __name__ == "__main__":
    main()
