"""A helper module of the user's: the branch on the rank is here, not in the script."""

import torch.distributed as dist


def sync_loss(loss, rank):
    if rank == 0:
        dist.reduce(loss, dst=0)
    return loss
