"""A hand-written two-stage pipeline (plain torch, gloo): stage 0 (rank 0) sends each
microbatch's activations to stage 1 (rank 1), which receives them; every step ends with a
barrier. SCENARIO picks one:

- healthy: blocking send/recv, every step's microbatches on both stages
- short: the first stage cuts its microbatches from the batch it holds, the second receives the
  configured number: the short last batch makes one message fewer than rank 1 waits for
- swapped: both ranks receive from the other first (nobody sends): a p2p deadlock
- batch: batch_isend_irecv (each step's messages as one batch), healthy
- batch_short: batch_isend_irecv with the short channel of ``short``
- async: isend/irecv whose Works are waited later, healthy
- dtype: the second stage receives into float64 buffers (the first sends float32)
"""
import os
from datetime import timedelta

import torch
import torch.distributed as dist

MICRO = 2  # rows per microbatch
BATCHES = (8, 8, 6)  # rows per step: the last batch is short
PLANNED = 4  # microbatches per step, as the configuration says


def microbatches(batch: torch.Tensor, scenario: str) -> tuple[torch.Tensor, ...]:
    if scenario.endswith("short"):
        return batch.split(MICRO)  # the bug: cut from the rows it holds, not the plan
    padded = torch.zeros(PLANNED * MICRO, batch.shape[1])
    padded[: len(batch)] = batch
    return padded.split(MICRO)


def send_stage(batch: torch.Tensor, scenario: str) -> None:
    chunks = microbatches(batch, scenario)
    if scenario.startswith("batch"):
        ops = [dist.P2POp(dist.isend, chunk.contiguous(), 1) for chunk in chunks]
        for work in dist.batch_isend_irecv(ops):
            work.wait()
        return
    if scenario == "async":
        works = [dist.isend(chunk.contiguous(), dst=1) for chunk in chunks]
        for work in works:
            work.wait()
        return
    for chunk in chunks:
        dist.send(chunk.contiguous(), dst=1)


def recv_stage(scenario: str) -> torch.Tensor:
    dtype = torch.float64 if scenario == "dtype" else torch.float32
    bufs = [torch.empty(MICRO, 4, dtype=dtype) for _ in range(PLANNED)]
    if scenario.startswith("batch"):
        ops = [dist.P2POp(dist.irecv, buf, 0) for buf in bufs]
        for work in dist.batch_isend_irecv(ops):
            work.wait()
    elif scenario == "async":
        works = [dist.irecv(buf, src=0) for buf in bufs]
        for work in works:
            work.wait()
    else:
        for buf in bufs:
            dist.recv(buf, src=0)
    return torch.cat(bufs)


def main() -> None:
    dist.init_process_group("gloo", timeout=timedelta(seconds=60))
    rank = dist.get_rank()
    scenario = os.environ.get("SCENARIO", "healthy")
    if scenario == "swapped":
        t = torch.zeros(4)
        dist.recv(t, src=1 - rank)  # the bug: each waits for the other to send first
        dist.send(t, dst=1 - rank)
    for step, rows in enumerate(BATCHES):
        if rank == 0:  # the stage split: the design, not a skipped call
            send_stage(torch.full((rows, 4), float(step)), scenario)
        else:
            recv_stage(scenario)
        dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
