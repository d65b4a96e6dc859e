"""What a device is doing, from its NVML samples. Pure.

NVML's utilisation is the share of time a kernel was running, not how hard the SMs work: an NCCL
kernel that polls a flag for a peer that never arrives reads 100%. What gives the spin away is
power, and device memory left alone. The thresholds and where each comes from:

- ``BUSY_UTIL`` 90%: every spinning reading, published or recorded, is 100%.
- ``SPIN_POWER_SHARE`` 40% of the power limit: published readings of hung NCCL jobs
  (tests/fixtures/gpu/published_readings.json, with their sources) read 14-22% (H100 116-152 W
  of 700 W, H100 PCIe 69-72 W of 350 W, V100 44 W of 250 W); nccl-doctor's own H100 runs
  (tests/fixtures/gpu/h100/) 16.5-17.6% while NCCL waited and 17% for a kernel that only spins
  (``torch.cuda._sleep``). Work draws far more: training at 98-100% utilisation 62-97% (A100),
  bf16 matmuls 71-100% and device-to-device copies 54% on the H100.
- ``SPIN_MEMORY_UTIL`` 10%: NVML's memory utilisation (share of time device memory was read or
  written) was 0 in every spinning H100 window, 17-32 under matmuls and 100 under copies: a
  device whose memory is busy is moving data, whatever its power.
- ``PAYLOAD_LINK_KBS`` 10 GB/s: interconnect traffic is evidence, not a verdict. Waiting NCCL
  kernels poll through the transport's proxy: the H100 runs read 90-430 MB/s of PCIe traffic
  with two ranks waiting and about 3.2 GB/s with eight (socket transport), while matmuls read
  26 MB/s and copies 50 MB/s - bytes alone do not tell polling from work. Only traffic three
  times the most polling measured counts as payload (``transfer``).

So ``spin``: utilisation >= 90% at <= 40% of the power limit, memory mostly idle (where reported)
and no payload-sized traffic; ``compute``: utilisation >= 90% above that power; ``transfer``:
payload-sized traffic, or device memory busy at low power; ``idle``: utilisation <= 10% (a
device holding a context but running nothing); ``partial`` in between; ``unknown`` without
utilisation or without power and limit. A window of samples is spinning when at least
``MIN_SAMPLES`` of them, and 80% of them, are.
"""

from __future__ import annotations

import enum
import statistics
from dataclasses import dataclass
from typing import Sequence

from nccl_doctor.gpu.readings import GpuDevice, GpuSample

BUSY_UTIL = 90.0
IDLE_UTIL = 10.0
SPIN_POWER_SHARE = 0.40
SPIN_MEMORY_UTIL = 10.0
PAYLOAD_LINK_KBS = 10_000_000.0  # 10 GB/s
MIN_SAMPLES = 3
SPIN_SHARE = 0.8


class Activity(str, enum.Enum):
    SPIN = "spin"
    COMPUTE = "compute"
    TRANSFER = "transfer"
    IDLE = "idle"
    PARTIAL = "partial"
    UNKNOWN = "unknown"


def classify(sample: GpuSample, device: GpuDevice | None) -> Activity:
    util = sample.util
    if util is None:
        return Activity.UNKNOWN
    if util <= IDLE_UTIL:
        return Activity.IDLE
    if util < BUSY_UTIL:
        return Activity.PARTIAL
    links = [v for v in (sample.pcie_kbs, sample.nvlink_kbs) if v is not None]
    if links and sum(links) >= PAYLOAD_LINK_KBS:
        return Activity.TRANSFER
    limit = device.power_limit_w if device is not None else None
    if sample.power_w is None or not limit:
        return Activity.UNKNOWN
    if sample.power_w > SPIN_POWER_SHARE * limit:
        return Activity.COMPUTE
    if sample.memory_util is not None and sample.memory_util >= SPIN_MEMORY_UTIL:
        return Activity.TRANSFER
    return Activity.SPIN


@dataclass(frozen=True)
class Window:
    """A device's samples over a span, summarised."""

    activity: Activity  # the verdict for the window (SPIN only when it held throughout)
    samples: int
    span_s: float
    util: float | None  # medians
    power_w: float | None
    power_limit_w: float | None
    link_kbs: float | None  # PCIe + NVLink, when reported
    counts: dict[str, int]

    @property
    def power_share(self) -> float | None:
        if self.power_w is None or not self.power_limit_w:
            return None
        return self.power_w / self.power_limit_w


def window(samples: Sequence[GpuSample], device: GpuDevice | None) -> Window:
    classes = [classify(s, device) for s in samples]
    counts: dict[str, int] = {}
    for c in classes:
        counts[c.value] = counts.get(c.value, 0) + 1
    if not classes:
        activity = Activity.UNKNOWN
    else:
        top = max(counts, key=counts.__getitem__)
        activity = Activity(top)
        if activity is Activity.SPIN and (len(classes) < MIN_SAMPLES
                                          or counts[top] < SPIN_SHARE * len(classes)):
            activity = Activity.UNKNOWN  # not enough to say it spins
    links = [sum(v for v in (s.pcie_kbs, s.nvlink_kbs) if v is not None) for s in samples
             if s.pcie_kbs is not None or s.nvlink_kbs is not None]
    return Window(
        activity=activity, samples=len(samples),
        span_s=samples[-1].t - samples[0].t if samples else 0.0,
        util=_median([s.util for s in samples]), power_w=_median([s.power_w for s in samples]),
        power_limit_w=device.power_limit_w if device is not None else None,
        link_kbs=statistics.median(links) if links else None, counts=counts,
    )


def _median(values: Sequence[float | None]) -> float | None:
    present = [v for v in values if v is not None]
    return statistics.median(present) if present else None
