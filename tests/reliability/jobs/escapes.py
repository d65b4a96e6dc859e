"""Rank 1 raises an exception whose message holds terminal control sequences: an OSC that would
retitle the terminal (ESC ] 0 ; ... BEL), a CSI colour (ESC [ 31 m), a C1 CSI (U+009B) and rich
markup. Its own stderr goes to /dev/null first, so that whatever reaches the terminal raw can only
be the doctor's rendering of it."""

import os

import torch
import torch.distributed as dist

PAYLOAD = "\x1b]0;pwned\x07\x1b[31m"


def main() -> None:
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    dist.all_reduce(torch.ones(4))
    dist.destroy_process_group()  # (no gloo thread left to abort the exit: the exception stands)
    if rank == 1:
        os.dup2(os.open(os.devnull, os.O_WRONLY), 2)
        raise RuntimeError(f"bad input {PAYLOAD} [bold]not markup[/bold] \x9b2J end")


main()
