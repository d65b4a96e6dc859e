"""The NVML boundary (nvidia-ml-py, import name ``pynvml``). Everything else in nccl_doctor.gpu is
pure and is tested with recorded readings; this module is the only one that needs a driver.

Facts relied on (NVML API reference): utilisation is the share of the last sample period (1/6 s
to 1 s, by product) during which at least one kernel ran - one spinning thread reads 100%; power
and limits are milliwatts; PCIe throughput is KB/s over a 20 ms window; NVLink data counters
(``NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX/RX``, scope UINT_MAX = every link) count KiB, so a rate
needs two readings; the per-process list gives host pids (not a container's).
"""

from __future__ import annotations

import ctypes
import sys
import time
from typing import Any, Callable, Protocol

from nccl_doctor.gpu.readings import GpuDevice, GpuSample

_ALL_LINKS = 0xFFFFFFFF


class GpuUnavailable(Exception):
    """No NVML here: the reason, in words."""


class GpuSource(Protocol):
    """What the sampler needs from NVML (a recorded source stands in for it in tests)."""

    def devices(self) -> list[GpuDevice]: ...
    def sample(self, index: int) -> GpuSample: ...
    def pids(self, index: int) -> set[int]: ...
    def close(self) -> None: ...


class Nvml:
    """A live NVML session. ``open`` raises GpuUnavailable with the reason."""

    def __init__(self, nvml: Any) -> None:
        self._nvml = nvml
        count = nvml.nvmlDeviceGetCount()
        self._handles = [nvml.nvmlDeviceGetHandleByIndex(i) for i in range(count)]
        self._nvlink: dict[int, tuple[float, float]] = {}  # index -> (t, KiB counter)

    @classmethod
    def open(cls) -> "Nvml":
        if not _library_loads():  # (what nvmlInit would find first, without importing pynvml)
            raise GpuUnavailable(_NO_DRIVER)
        try:
            import pynvml
        except ImportError:
            raise GpuUnavailable("nvidia-ml-py is not installed") from None
        try:
            pynvml.nvmlInit()
        except pynvml.NVMLError as err:
            raise GpuUnavailable(_words(err)) from None
        try:
            session = cls(pynvml)
        except pynvml.NVMLError as err:
            pynvml.nvmlShutdown()
            raise GpuUnavailable(f"NVML lists no device: {_words(err)}") from None
        if not session._handles:
            session.close()
            raise GpuUnavailable("NVML lists no GPU on this host")
        return session

    def _get(self, fn: Callable[..., Any], *args: Any) -> Any:
        try:
            return fn(*args)
        except self._nvml.NVMLError:
            return None  # not supported on this device (MIG, vGPU, older boards) or transient

    def devices(self) -> list[GpuDevice]:
        n, out = self._nvml, []
        for i, h in enumerate(self._handles):
            limit = self._get(n.nvmlDeviceGetEnforcedPowerLimit, h)
            memory = self._get(n.nvmlDeviceGetMemoryInfo, h)
            out.append(GpuDevice(
                index=i, uuid=str(self._get(n.nvmlDeviceGetUUID, h) or ""),
                name=str(self._get(n.nvmlDeviceGetName, h) or ""),
                power_limit_w=limit / 1000 if limit else None,
                sm_max_mhz=self._get(n.nvmlDeviceGetMaxClockInfo, h, n.NVML_CLOCK_SM),
                memory_total_mib=memory.total / 2**20 if memory is not None else None,
            ))
        return out

    def sample(self, index: int) -> GpuSample:
        n, h = self._nvml, self._handles[index]
        t = time.time()
        util = self._get(n.nvmlDeviceGetUtilizationRates, h)
        power = self._get(n.nvmlDeviceGetPowerUsage, h)
        memory = self._get(n.nvmlDeviceGetMemoryInfo, h)
        tx = self._get(n.nvmlDeviceGetPcieThroughput, h, n.NVML_PCIE_UTIL_TX_BYTES)
        rx = self._get(n.nvmlDeviceGetPcieThroughput, h, n.NVML_PCIE_UTIL_RX_BYTES)
        return GpuSample(
            t=t, index=index,
            util=float(util.gpu) if util is not None else None,
            memory_util=float(util.memory) if util is not None else None,
            sm_mhz=self._get(n.nvmlDeviceGetClockInfo, h, n.NVML_CLOCK_SM),
            power_w=power / 1000 if power is not None else None,
            memory_used_mib=memory.used / 2**20 if memory is not None else None,
            pcie_kbs=float(tx + rx) if tx is not None and rx is not None else None,
            nvlink_kbs=self._nvlink_rate(index, h, t),
        )

    def _nvlink_rate(self, index: int, handle: Any, t: float) -> float | None:
        n = self._nvml
        values = self._get(n.nvmlDeviceGetFieldValues, handle, [
            (n.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX, _ALL_LINKS),
            (n.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX, _ALL_LINKS),
        ])
        if values is None or any(v.nvmlReturn != n.NVML_SUCCESS for v in values):
            return None  # no NVLink on this device
        total = float(sum(v.value.ullVal for v in values))
        previous = self._nvlink.get(index)
        self._nvlink[index] = (t, total)
        if previous is None or t <= previous[0] or total < previous[1]:
            return None
        return (total - previous[1]) / (t - previous[0])

    def pids(self, index: int) -> set[int]:
        procs = self._get(self._nvml.nvmlDeviceGetComputeRunningProcesses, self._handles[index])
        return {int(p.pid) for p in procs or ()}

    def close(self) -> None:
        try:
            self._nvml.nvmlShutdown()
        except self._nvml.NVMLError:
            pass


_NO_DRIVER = "no NVIDIA driver on this host (libnvidia-ml.so.1 not found)"


def _library_loads() -> bool:
    """Whether NVML's library can be loaded, as nvidia-ml-py loads it on Linux (on other
    systems: assumed so, nvmlInit says). A host with no driver is told in a fraction of a
    millisecond, where importing nvidia-ml-py to be told costs 10-15 ms of the run's start."""
    if not sys.platform.startswith("linux"):
        return True
    try:
        ctypes.CDLL("libnvidia-ml.so.1")
    except OSError:
        return False
    return True


def _words(err: Exception) -> str:
    text = str(err)
    if "Library Not Found" in text or "LibraryNotFound" in type(err).__name__:
        return _NO_DRIVER
    return f"NVML cannot start: {text}"
