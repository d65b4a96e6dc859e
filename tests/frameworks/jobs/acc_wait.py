"""Accelerate: ``wait_for_everyone`` on the main process only, then a reduce on every rank.

``wait_for_everyone`` is a barrier: the main process waits in it while the others are already
in the reduce, and the job hangs. ``--fixed`` waits on every rank.

    torchrun --nproc-per-node 2 acc_wait.py [--fixed]
"""

import argparse

import torch
from accelerate import Accelerator


def total_of(accelerator, total):
    if accelerator.is_main_process:
        accelerator.wait_for_everyone()
    return accelerator.reduce(total, reduction="sum")


def total_of_fixed(accelerator, total):
    accelerator.wait_for_everyone()
    return accelerator.reduce(total, reduction="sum")


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--fixed", action="store_true")
    args = parser.parse_args()
    accelerator = Accelerator(cpu=True)
    total = torch.ones(4) * accelerator.process_index
    for _ in range(3):
        total = total + 1
    total = (total_of_fixed if args.fixed else total_of)(accelerator, total)
    accelerator.print(total)
    accelerator.end_training()


if __name__ == "__main__":
    main()
