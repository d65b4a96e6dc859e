"""Accelerate: the main process gathers the predictions for its metric, through a variable.

``gather_for_metrics`` is an all-gather: reached on the main process only (``is_main`` holds
``accelerator.is_main_process``), it waits for ranks that went on to the final
``wait_for_everyone``, and the job hangs. ``--fixed`` gathers on every rank and reports on the
main process.

    torchrun --nproc-per-node 2 acc_gather_metrics.py [--fixed]
"""

import argparse

import torch
from accelerate import Accelerator


def report(accelerator, predictions, labels):
    is_main = accelerator.is_main_process
    if is_main:
        predictions, labels = accelerator.gather_for_metrics((predictions, labels))
        print("accuracy", (predictions == labels).float().mean().item())


def report_fixed(accelerator, predictions, labels):
    predictions, labels = accelerator.gather_for_metrics((predictions, labels))
    accelerator.print("accuracy", (predictions == labels).float().mean().item())


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--fixed", action="store_true")
    args = parser.parse_args()
    accelerator = Accelerator(cpu=True)
    torch.manual_seed(accelerator.process_index)
    predictions, labels = torch.randint(0, 2, (8,)), torch.randint(0, 2, (8,))
    (report_fixed if args.fixed else report)(accelerator, predictions, labels)
    accelerator.wait_for_everyone()
    accelerator.end_training()


if __name__ == "__main__":
    main()
