"""Where a reference trainer or reproducer runs: ``--device cpu|cuda`` and ``--backend gloo|nccl``.

``--device cpu`` (the default) runs on gloo, as every CPU-only machine can. ``--device cuda``
runs on NCCL: the model, the batches and every collective's tensors live on the rank's GPU, so
the hangs are NCCL's own (a size-mismatched all-gather spins with the GPU at 100%).

On CUDA each rank takes its own GPU when the host has one per rank: ``LOCAL_RANK``, or ``RANK``
when the whole job runs on this machine (simulated nodes, nccl_doctor/reproducers/nodes.py,
restart ``LOCAL_RANK`` on every node). With fewer GPUs than ranks, ranks share them. NCCL refuses
two ranks of one host on one GPU ("Duplicate GPU detected"), so each sharing rank claims its own
host id (``NCCL_HOSTID``) and NCCL joins them through sockets, its inter-node path, on the
loopback interface (``NCCL_SOCKET_IFNAME=lo``) when the whole job is on this machine. That is how
nccl-doctor's own H100 runs put 2 and 8 NCCL ranks on one GPU (tests/fixtures/gpu/h100): slower
than NVLink or shared memory, but the same collectives, hangs and Flight Recorder entries. A
variable the user set is left as it is.
"""

from __future__ import annotations

import argparse
import glob
import os
import sys
from dataclasses import dataclass, field
from typing import Mapping

DEVICES = ("cpu", "cuda")
BACKENDS = ("gloo", "nccl")
LOOPBACK = ("localhost", "::1")


class PlacementError(ValueError):
    """A --device/--backend this machine cannot run (one line, for the rank's stderr)."""


@dataclass(frozen=True)
class Placement:
    device: str  # "cpu" or "cuda:N"
    backend: str
    gpus: int = 0  # GPUs this host's ranks use
    ranks: int = 1  # ranks on them
    env: dict[str, str] = field(default_factory=dict)  # set before init_process_group

    @property
    def shared(self) -> bool:
        """Several ranks on one GPU (each its own NCCL_HOSTID)."""
        return self.ranks > self.gpus > 0

    def describe(self) -> str:
        if self.device == "cpu":
            return f"CPU, {self.backend}"
        if not self.shared:
            return f"CUDA, {self.backend}: one GPU per rank ({self.ranks} ranks)"
        how = ", ".join(f"{k}={v}" for k, v in sorted(self.env.items()))
        return (f"CUDA, {self.backend}: {self.ranks} ranks share {self.gpus} "
                f"GPU{'s' if self.gpus > 1 else ''} - each rank claims its own host id, so NCCL "
                "joins them through sockets (its inter-node path), not NVLink or shared memory"
                + (f" (this rank: {how})" if how else ""))


def default_backend(device: str) -> str:
    return "nccl" if device == "cuda" else "gloo"


def _loopback(addr: str) -> bool:
    return addr.startswith("127.") or addr in LOOPBACK


def place(device: str, backend: str | None, env: Mapping[str, str], gpus: int) -> Placement:
    """Where this rank runs, from torchrun's variables in ``env`` and the GPUs torch sees. Pure."""
    if device not in DEVICES:
        raise PlacementError(f"unknown --device {device!r}: one of {', '.join(DEVICES)}")
    backend = backend or default_backend(device)
    if backend not in BACKENDS:
        raise PlacementError(f"unknown --backend {backend!r}: one of {', '.join(BACKENDS)}")
    if device == "cpu":
        if backend == "nccl":
            raise PlacementError("--backend nccl needs GPUs: add --device cuda, or use "
                                 "--backend gloo on the CPU")
        return Placement("cpu", backend)
    if gpus < 1:
        raise PlacementError("--device cuda, but torch sees no GPU (torch.cuda.device_count() "
                             "is 0: no driver, or CUDA_VISIBLE_DEVICES is empty); run with "
                             "--device cpu")
    rank, world = int(env.get("RANK", "0")), int(env.get("WORLD_SIZE", "1"))
    local_rank = int(env.get("LOCAL_RANK", str(rank)))
    local_world = int(env.get("LOCAL_WORLD_SIZE", str(world)))
    one_machine = local_world == world or _loopback(env.get("MASTER_ADDR", ""))
    index, here = (rank, world) if one_machine else (local_rank, local_world)
    if here <= gpus:
        return Placement(f"cuda:{index}", backend, gpus=here, ranks=here)
    extra: dict[str, str] = {}
    if backend == "nccl":
        if "NCCL_HOSTID" not in env:
            extra["NCCL_HOSTID"] = f"nccl-doctor-rank{rank}"
        if one_machine and "NCCL_SOCKET_IFNAME" not in env:
            extra["NCCL_SOCKET_IFNAME"] = "lo"
    return Placement(f"cuda:{index % gpus}", backend, gpus=gpus, ranks=here, env=extra)


def add_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--device", choices=DEVICES, default="cpu",
                        help="where the model and every collective's tensors live: cpu (gloo, "
                             "the default) or cuda (NCCL; one GPU per rank, or ranks sharing "
                             "GPUs through NCCL's socket path when there are fewer)")
    parser.add_argument("--backend", choices=BACKENDS, default=None,
                        help="the process group's backend (default: gloo on cpu, nccl on cuda)")


def init(parser: argparse.ArgumentParser, args: argparse.Namespace):
    """Place this rank (``args.device``, ``args.backend``), create the default process group and
    return the ``torch.device`` its tensors go on. A placement this machine cannot run ends the
    rank with one line (``parser.error``: exit status 2)."""
    import torch
    import torch.distributed as dist

    gpus = torch.cuda.device_count() if args.device == "cuda" else 0
    try:
        where = place(args.device, args.backend, os.environ, gpus)
    except PlacementError as err:
        parser.error(str(err))
    os.environ.update(where.env)  # NCCL reads them when the communicator is created: now
    device = torch.device(where.device)
    if device.type == "cuda":
        torch.cuda.set_device(device)
        if where.backend == "nccl":  # eager: the communicator exists when init returns
            dist.init_process_group(where.backend, device_id=device)
        else:
            dist.init_process_group(where.backend)
    else:
        dist.init_process_group(where.backend)
    if dist.get_rank() == 0 and device.type == "cuda":
        print(f"{parser.prog}: on {where.describe()}", file=sys.stderr, flush=True)
    return device


def visible_gpus() -> tuple[int, str]:
    """How many GPUs torch sees on this machine, and why none if none. Looks for the NVIDIA
    driver first, so a machine without one never pays for importing torch."""
    if not (os.path.exists("/proc/driver/nvidia") or glob.glob("/dev/nvidia[0-9]*")):
        return 0, "no NVIDIA driver on this host"
    import torch

    if torch.version.cuda is None:
        return 0, f"torch {torch.__version__} is built without CUDA"
    n = torch.cuda.device_count()
    return n, "" if n else ("torch sees no GPU (torch.cuda.device_count() is 0: "
                            "CUDA_VISIBLE_DEVICES?)")
