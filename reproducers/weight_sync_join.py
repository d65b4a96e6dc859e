"""docs/bugs.md D: a multi-node stall after the inference engines start (OpenRLHF #918; #865, #492).

What happens: actor rank 0 creates a weight-sync process group (itself plus every inference
engine worker) over a TCP rendezvous and asks each worker to join it; the other actor ranks go
straight to a barrier of the training group. If a worker never joins (in the report: vLLM >= 0.8.1
runs the V1 engine core in a child process, where the join request is never executed), rank 0
waits in the rendezvous ("17/33 clients joined") and the other ranks wait in the barrier:
silently, until the 30-minute timeout.

Here one "engine worker" is a child process of rank 0 that never joins. ``--fixed`` makes it join
(the reported workaround: VLLM_ENABLE_V1_MULTIPROCESSING=0 keeps the engine core in the worker);
rank 0 then broadcasts the weights over the new group and joins the barrier. With ``--device
cuda`` the actors' training group is NCCL's; the weight-sync group stays a CPU (gloo) group, since
the engine worker needs no GPU to show the stall.

    torchrun --nproc-per-node 3 -m nccl_doctor.reproducers.weight_sync_join [--fixed] \\
        [--device cuda]
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from datetime import timedelta

import torch
import torch.distributed as dist

from nccl_doctor.reproducers.nodes import free_port
from nccl_doctor.trainers import placement

#: the engine worker: joins the weight-sync group (``--fixed``) or, as in the report, leaves the
#: join to an engine-core child that never runs it
WORKER = """
import sys, time
from datetime import timedelta
import torch, torch.distributed as dist
port, join = int(sys.argv[1]), sys.argv[2] == "1"
if not join:
    while True:  # the engine core runs elsewhere; nobody answers the join request
        time.sleep(1)
store = dist.TCPStore("127.0.0.1", port, world_size=2, is_master=False,
                      timeout=timedelta(seconds=60))
group = dist.ProcessGroupGloo(store, 1, 2, timedelta(seconds=60))
weights = torch.zeros(4)
group.broadcast(weights, 0).wait()
print(f"engine worker: received weights {weights.tolist()}", flush=True)
"""


def create_weight_sync_group(port: int, engines: int) -> dist.ProcessGroup:
    """Rank 0's side: host the rendezvous and wait until every engine worker has joined."""
    store = dist.TCPStore("127.0.0.1", port, world_size=1 + engines, is_master=True,
                          wait_for_workers=True, timeout=timedelta(hours=1))
    return dist.ProcessGroupGloo(store, 0, 1 + engines, timedelta(hours=1))


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--fixed", action="store_true", help="the engine worker joins the group")
    placement.add_options(p)
    args = p.parse_args(argv)
    device = placement.init(p, args)
    rank = dist.get_rank()
    dist.all_reduce(torch.ones(1, device=device))  # the actors' training group is up
    worker = None
    if rank == 0:
        port = free_port()
        worker = subprocess.Popen([sys.executable, "-c", WORKER, str(port),
                                   "1" if args.fixed else "0"])
        group = create_weight_sync_group(port, engines=1)
        weights = torch.arange(4, dtype=torch.float32)
        group.broadcast(weights, 0).wait()
        print("actor rank 0: weights sent to the engines", flush=True)
    dist.barrier()  # the other actors went straight here
    if worker is not None:
        worker.wait(timeout=60)
    dist.all_reduce(torch.ones(1, device=device))
    time.sleep(0.1)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
