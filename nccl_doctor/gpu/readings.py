"""GPU samples as the analysis sees them. Frozen dataclasses; no NVML, no I/O."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Mapping


@dataclass(frozen=True)
class GpuDevice:
    index: int  # NVML's index on this host (nvidia-smi's numbering)
    uuid: str = ""
    name: str = ""
    power_limit_w: float | None = None  # the enforced limit
    sm_max_mhz: float | None = None
    memory_total_mib: float | None = None


@dataclass(frozen=True)
class GpuSample:
    """One look at one device. ``None``: the device does not report that metric."""

    t: float  # unix time, seconds (comparable with the recorder's enter times on this host)
    index: int
    util: float | None = None  # % of the last sample period with a kernel running (NVML)
    memory_util: float | None = None  # % of it with device memory read or written
    sm_mhz: float | None = None
    power_w: float | None = None
    memory_used_mib: float | None = None
    pcie_kbs: float | None = None  # PCIe TX+RX, KB/s
    nvlink_kbs: float | None = None  # NVLink data TX+RX, KiB/s over all links


@dataclass(frozen=True)
class RankGpu:
    """Which device a rank runs on, and how that was found."""

    index: int
    how: str  # "nvml_pids" (the device lists the rank's pid) | "environment" (CUDA_VISIBLE_DEVICES
    #           and LOCAL_RANK) | "local_rank" (no CUDA_VISIBLE_DEVICES: device LOCAL_RANK)


@dataclass(frozen=True)
class GpuTrace:
    """Everything ``gpu.jsonl`` held: the devices, the rank mapping, the samples (time order)."""

    available: bool
    reason: str = ""  # why nothing was sampled, when not available
    host: str = ""
    devices: Mapping[int, GpuDevice] = field(default_factory=dict)
    ranks: Mapping[int, RankGpu] = field(default_factory=dict)
    samples: tuple[GpuSample, ...] = ()
    stopped: str = ""  # why sampling stopped early, if it did
    damaged: str = ""  # what of the file could not be read (lines skipped), if anything

    def series(self, index: int, since: float = 0.0,
               until: float = float("inf")) -> tuple[GpuSample, ...]:
        return tuple(s for s in self.samples if s.index == index and since <= s.t <= until)
