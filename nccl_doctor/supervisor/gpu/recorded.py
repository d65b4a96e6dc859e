"""A GPU source that plays back recorded readings instead of asking NVML: what the sampler and
the analysis are tested with on machines without an NVIDIA GPU (the readings come from real
devices; see tests/fixtures/gpu/published_readings.json).

A reading is a mapping with ``util``, ``power_w``, ``power_limit_w`` and optionally ``gpu`` (the
name), ``memory_used_mib``, ``pcie_kbs``, ``nvlink_kbs``. Each device plays its own list in order
and then holds its last reading.
"""

from __future__ import annotations

import time
from typing import Any, Mapping, Sequence

from nccl_doctor.gpu.readings import GpuDevice, GpuSample


class RecordedGpus:
    def __init__(self, readings: Mapping[int, Sequence[Mapping[str, Any]]],
                 pids: Mapping[int, set[int]] | None = None) -> None:
        self.readings = {i: list(r) for i, r in readings.items() if r}
        self._pids = dict(pids or {})
        self._next = dict.fromkeys(self.readings, 0)
        self.closed = False

    def devices(self) -> list[GpuDevice]:
        return [GpuDevice(index=i, uuid=f"GPU-recorded-{i}", name=str(r[0].get("gpu", "")),
                          power_limit_w=r[0].get("power_limit_w"))
                for i, r in sorted(self.readings.items())]

    def sample(self, index: int) -> GpuSample:
        series = self.readings[index]
        reading = series[min(self._next[index], len(series) - 1)]
        self._next[index] += 1
        return GpuSample(
            t=time.time(), index=index, util=reading.get("util"),
            power_w=reading.get("power_w"), memory_used_mib=reading.get("memory_used_mib"),
            pcie_kbs=reading.get("pcie_kbs"), nvlink_kbs=reading.get("nvlink_kbs"),
        )

    def pids(self, index: int) -> set[int]:
        return set(self._pids.get(index, ()))

    def close(self) -> None:
        self.closed = True
