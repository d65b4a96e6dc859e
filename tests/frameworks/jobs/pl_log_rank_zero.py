"""Lightning DDP: a ``LightningModule`` hook logs a metric with ``sync_dist=True`` on rank 0 only.

``self.log(..., sync_dist=True)`` reduces the value across the ranks (at once for a per-step
value), so it must run on every rank. Here the hook logs on global rank 0 alone: rank 0 enters
the reduction while the others go on to their next training step, and the job hangs. ``--fixed``
logs on every rank.

    torchrun --nproc-per-node 2 pl_log_rank_zero.py [--fixed]
"""

import argparse
import os

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

    def on_train_batch_end(self, outputs, batch, batch_idx):
        if self.global_rank == 0:
            self.log("train_loss", outputs["loss"], sync_dist=True)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


class RegressionFixed(Regression):
    def on_train_batch_end(self, outputs, batch, batch_idx):
        self.log("train_loss", outputs["loss"], sync_dist=True)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--fixed", action="store_true")
    args = parser.parse_args()
    torch.manual_seed(0)
    rows = 32 * int(os.environ["WORLD_SIZE"])  # 8 batches of 4 on each rank
    data = TensorDataset(torch.randn(rows, 8), torch.randn(rows, 1))
    trainer = L.Trainer(accelerator="cpu", devices=int(os.environ["WORLD_SIZE"]), strategy="ddp",
                        max_epochs=1, logger=False, enable_checkpointing=False,
                        enable_progress_bar=False, enable_model_summary=False)
    module = (RegressionFixed if args.fixed else Regression)()
    trainer.fit(module, DataLoader(data, batch_size=4))
    end()


if __name__ == "__main__":
    main()
