"""DDP with uneven data: rank 0 has one batch more than the others. Its extra backward issues
DDP's gradient all_reduce from C++ (never through torch.distributed's Python API) while the other
ranks, done with their data, wait in the barrier after the loop: a desync only Flight Recorder
sees."""

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP


def main() -> None:
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    model = DDP(torch.nn.Linear(8, 4))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    batches = 4 + (1 if rank == 0 else 0)  # uneven shards: no DistributedSampler(drop_last)
    for _ in range(batches):
        loss = model(torch.randn(16, 8)).pow(2).mean()
        opt.zero_grad()
        loss.backward()  # DDP all-reduces the gradients here, from C++
        opt.step()
    dist.barrier()  # "wait for everyone before saving"
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
