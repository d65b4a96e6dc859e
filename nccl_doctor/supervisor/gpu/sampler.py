"""The supervisor's GPU sampler: a thread that reads NVML and appends to ``gpu.jsonl``.

NVML calls can block for seconds on a sick driver, so they never run on the supervisor's loop:
the loop (``tick``) only tells the thread how often to sample - every ``slow`` seconds while the
job moves, every ``fast`` seconds once nothing has been recorded for a second (the watchdog is
looking: a hang may be starting) - and which ranks exist,
with the hints that place them on devices. Without NVML the thread writes one header line saying
why and stops. It never raises into the supervisor, and the file is bounded (series.GpuLog).
"""

from __future__ import annotations

from nccl_doctor.env import host_name
import threading
import time
from pathlib import Path
from typing import Any, Callable, Mapping

import psutil

from nccl_doctor.supervisor.gpu.mapping import RankHints, map_ranks
from nccl_doctor.supervisor.gpu.nvml import GpuSource, GpuUnavailable, Nvml
from nccl_doctor.gpu.series import GpuLog

SLOW = 10.0
FAST = 0.5


class GpuSampler:
    """``Supervisor`` listener. ``ranks()`` gives {rank: (pid, local_rank)} of this host's ranks;
    ``fast()`` says whether to sample fast (nothing has been recorded for a second)."""

    def __init__(self, out_dir: Path, *, ranks: Callable[[], Mapping[int, tuple[int, int | None]]],
                 fast: Callable[[], bool] = lambda: False,
                 open_source: Callable[[], GpuSource] = Nvml.open,
                 slow: float = SLOW, fast_every: float = FAST) -> None:
        self.log = GpuLog(out_dir)
        self.ranks, self.wants_fast, self.open_source = ranks, fast, open_source
        self.slow, self.fast = slow, fast_every
        self.interval = slow
        self.hints: dict[int, RankHints] = {}
        self.error: str | None = None  # why sampling stopped early, if it did
        self._wake, self._stop = threading.Event(), threading.Event()
        self._thread: threading.Thread | None = None

    def __call__(self, _supervisor: Any = None) -> None:
        try:
            self.tick()
        except Exception as err:  # never take the supervisor down
            self.error = f"GPU sampling stopped: {err!r}"
            self._stop.set()
            self.tick = lambda: None  # type: ignore[method-assign]

    def tick(self) -> None:
        interval = self.fast if self.wants_fast() else self.slow
        ranks = self.ranks()
        wake = interval < self.interval
        if {r: pid for r, (pid, _) in ranks.items()} != {r: h.pid for r, h in self.hints.items()}:
            # a rank joined, or restarted with a new pid
            self.hints = {r: _hints(pid, local) for r, (pid, local) in ranks.items()}
            wake = True
        self.interval = interval
        if self._thread is None:  # the first look maps and samples at once
            self._thread = threading.Thread(target=self._run, name="nccl-doctor-gpu", daemon=True)
            self._thread.start()
        elif wake:
            self._wake.set()

    def close(self, timeout: float = 2.0) -> None:
        """Stop sampling (one last sample first, so a report written now sees the end)."""
        if self._thread is None:
            return
        self._stop.set()
        self._wake.set()
        self._thread.join(timeout)

    def _run(self) -> None:
        try:
            self._sample_until_stopped()
        except Exception as err:  # an NVML binding failing in an unforeseen way, a full disk
            self.error = f"GPU sampling stopped: {err!r}"
            try:
                self.log.error(self.error)
            except OSError:
                pass

    def _sample_until_stopped(self) -> None:
        try:
            source = self.open_source()
        except GpuUnavailable as err:
            self.log.header(available=False, reason=str(err), host=host_name())
            return
        try:
            devices = {d.index: d for d in source.devices()}
            self.log.header(available=True, host=host_name(), devices=devices.values())
            mapped_for: dict[int, RankHints] | None = None
            mapped_at = 0.0
            mapping: dict = {}
            while True:
                stopping = self._stop.is_set()
                hints = self.hints
                # Ranks join before they create their CUDA context, so NVML's pid lists fill in
                # later: map again every slow period until NVML itself places every rank.
                unsure = any(g.how != "nvml_pids" for g in mapping.values()) or \
                    len(mapping) < len(hints)
                if hints is not mapped_for or (unsure and time.time() - mapped_at >= self.slow):
                    pids = {i: source.pids(i) for i in devices}
                    new = map_ranks(hints, devices, pids)
                    if new != mapping:
                        mapping = new
                        self.log.ranks(time.time(), mapping)
                    mapped_for, mapped_at = hints, time.time()
                self.log.samples([source.sample(i) for i in devices])
                if stopping:
                    break
                self._wake.wait(self.interval)
                self._wake.clear()
        finally:
            try:
                source.close()
            except Exception:
                pass


def _hints(pid: int, local_rank: int | None) -> RankHints:
    try:
        visible = psutil.Process(pid).environ().get("CUDA_VISIBLE_DEVICES")
    except (psutil.Error, OSError):  # its environment is unknown: only NVML's pids can place it
        return RankHints(pid, None, None)
    return RankHints(pid, local_rank, visible)
