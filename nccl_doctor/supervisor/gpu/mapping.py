"""Which GPU each rank runs on. Pure: the inputs are NVML's per-process lists and each rank's
environment, gathered elsewhere.

In order of trust:
1. NVML lists the rank's pid among a device's compute processes (the device it actually holds a
   context on). NVML reports host pids, so inside a container with its own pid namespace this can
   fail to match; then
2. the rank's ``CUDA_VISIBLE_DEVICES`` (indexes or ``GPU-`` UUIDs) and ``LOCAL_RANK``: the rank
   uses the LOCAL_RANK-th visible device, as ``torch.cuda.set_device(local_rank)`` - the
   convention of torchrun, accelerate and deepspeed - makes it; without CUDA_VISIBLE_DEVICES,
   device LOCAL_RANK.
A rank none of these place gets no device.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping

from nccl_doctor.gpu.readings import GpuDevice, RankGpu


@dataclass(frozen=True)
class RankHints:
    pid: int
    local_rank: int | None
    visible: str | None  # the rank's CUDA_VISIBLE_DEVICES (None: unset)


def map_ranks(hints: Mapping[int, RankHints], devices: Mapping[int, GpuDevice],
              pids: Mapping[int, set[int]]) -> dict[int, RankGpu]:
    """rank -> the device it runs on, for the ranks that can be placed."""
    by_pid = {pid: index for index, owned in pids.items() for pid in owned}
    by_uuid = {d.uuid: i for i, d in devices.items() if d.uuid}
    out = {}
    for rank, h in hints.items():
        if h.pid in by_pid:
            out[rank] = RankGpu(by_pid[h.pid], "nvml_pids")
            continue
        if h.local_rank is None:
            continue
        if h.visible is None:
            if h.local_rank in devices:
                out[rank] = RankGpu(h.local_rank, "local_rank")
            continue
        entries = [v.strip() for v in h.visible.split(",") if v.strip()]
        if h.local_rank >= len(entries):
            continue
        index = _device(entries[h.local_rank], by_uuid)
        if index is not None and index in devices:
            out[rank] = RankGpu(index, "environment")
    return out


def _device(entry: str, by_uuid: Mapping[str, int]) -> int | None:
    if entry.isascii() and entry.isdigit():
        return int(entry)
    if entry.startswith("GPU-"):  # a UUID, possibly abbreviated (CUDA accepts a unique prefix)
        found = [i for uuid, i in by_uuid.items() if uuid.startswith(entry)]
        return found[0] if len(found) == 1 else None
    return None  # MIG-..., or something CUDA would reject
