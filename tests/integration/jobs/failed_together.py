"""Every rank fails inside the same collective (issue 50): an all_gather_into_tensor whose
output each rank sizes its own way, which gloo refuses on every rank - no desync, no rank
missing, only errors."""
import torch
import torch.distributed as dist


def main() -> None:
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    x = torch.ones(4)
    dist.all_reduce(x)
    out = torch.empty(3 + rank)  # the bug: sized per rank, never world_size * 4
    dist.all_gather_into_tensor(out, x)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
