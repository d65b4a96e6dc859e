"""A rank blocked outside any collective while its peers wait in one (issue 50).

SCENARIO:
  store_wait  - rank 1 waits in a store barrier (torch's elastic store helper) that rank 0
                never reaches: rank 0 waits in an all_reduce for rank 1
  dataloader  - rank 1's DataLoader worker never returns its third batch (a lock held
                forever in the dataset): rank 1 waits on its worker, rank 0 in all_reduce
"""
import os
import threading
from datetime import timedelta

import torch
import torch.distributed as dist
from torch.utils.data import DataLoader, Dataset


class Batches(Dataset):
    """Batch ``stuck_at`` of rank ``stuck_rank`` never comes: its worker blocks forever."""

    def __init__(self, rank: int, stuck_rank: int, stuck_at: int) -> None:
        self.rank, self.stuck_rank, self.stuck_at = rank, stuck_rank, stuck_at
        self.never = threading.Event()

    def __len__(self) -> int:
        return 8

    def __getitem__(self, i: int) -> torch.Tensor:
        if self.rank == self.stuck_rank and i == self.stuck_at:
            self.never.wait()  # the worker is stuck here
        return torch.ones(4) * i


def main() -> None:
    dist.init_process_group("gloo", timeout=timedelta(seconds=float(
        os.environ.get("GLOO_TIMEOUT_S", "1800"))))
    rank = dist.get_rank()
    scenario = os.environ.get("SCENARIO", "store_wait")
    x = torch.ones(4)
    dist.all_reduce(x)
    if scenario == "store_wait":
        if rank == 1:
            from torch.distributed.elastic.utils.store import barrier

            store = dist.distributed_c10d._get_default_store()
            barrier(store, 2, key_prefix="nccl_doctor_test/ready", barrier_timeout=1800)
        dist.all_reduce(x)
    elif scenario == "dataloader":
        loader = DataLoader(Batches(rank, 1, 2), batch_size=None, num_workers=1)
        for batch in loader:
            dist.all_reduce(batch)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
