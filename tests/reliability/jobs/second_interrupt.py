"""Rank 1 fails, and a second signal lands while the doctor's excepthook notes the failure - as
torchrun's forwarded SIGINT does, just after the user's own Ctrl-C reached the rank. The signal
is raised from the exception's ``__str__``, which the excepthook calls, so that it lands inside
the hook every time rather than by the luck of timing."""

import signal

import torch
import torch.distributed as dist


class BatchError(Exception):
    raised = False

    def __str__(self) -> str:
        if not BatchError.raised:
            BatchError.raised = True
            signal.raise_signal(signal.SIGINT)  # the second Ctrl-C, mid-note
        return "bad batch 7"


def main() -> None:
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    dist.all_reduce(torch.ones(4))
    if rank == 1:
        raise BatchError()
    dist.all_reduce(torch.ones(4))  # rank 0 waits here for a peer that is gone


main()
