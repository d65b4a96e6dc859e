"""``gpu.jsonl``: the GPU samples beside the captures. One JSON object per line:

- ``{"kind": "header", "format": "nccl-doctor-gpu", "format_version": 1, "available": bool,
  "reason": str, "host": str, "devices": [{index, uuid, name, power_limit_w, sm_max_mhz,
  memory_total_mib}]}`` - first; without NVML the only line, saying why;
- ``{"kind": "ranks", "t": float, "ranks": {"<rank>": {"index": int, "how": str}}}`` - each time
  the rank -> device mapping changes (the last one counts);
- ``{"kind": "sample", "t": float, "index": int, "util": ..., ...}`` - the fields of GpuSample;
- ``{"kind": "error", "t": float, "reason": str}`` - sampling stopped early, and why.

The file is bounded: past ``max_bytes`` it is rewritten with the header, the mapping and the newer
half of the samples. Reading it never trusts it: odd lines are skipped, numbers must be finite.
"""

from __future__ import annotations

import json
import math
import threading
import time
from collections import deque
from dataclasses import asdict, fields
from pathlib import Path
from typing import Any, Iterable, Mapping

from nccl_doctor import bounded_json
from nccl_doctor.files import read_regular
from nccl_doctor.files import write_atomic
from nccl_doctor.gpu.readings import GpuDevice, GpuSample, GpuTrace, RankGpu
from nccl_doctor.capture.names import GPU_JSONL

FORMAT = "nccl-doctor-gpu"
FORMAT_VERSION = 1
MAX_BYTES = 4 << 20
MAX_READ = 16 << 20

_SAMPLE_FIELDS = tuple(f.name for f in fields(GpuSample))
_DEVICE_FIELDS = tuple(f.name for f in fields(GpuDevice))


class GpuLog:
    """Appends to ``gpu.jsonl``; one writer (the sampler thread). It holds what the file says:
    ``trace()`` is what ``read_gpu`` would read from it, without reading it."""

    def __init__(self, directory: Path, *, max_bytes: int = MAX_BYTES) -> None:
        self.path = directory / GPU_JSONL
        self.max_bytes = max_bytes
        self._header = ""
        self._ranks = ""
        self._error = ""
        self._samples: deque[str] = deque(maxlen=max(16, max_bytes // 64))
        self._size = 0
        self._lock = threading.Lock()  # the sampler thread writes, the supervisor's loop reads
        self.version = 0  # changes with what the file says
        self._available, self._reason, self._host = False, "", ""
        self._devices: dict[int, GpuDevice] = {}
        self._mapping: dict[int, RankGpu] = {}
        self._held: deque[GpuSample] = deque(maxlen=self._samples.maxlen)
        self._stopped = ""

    def header(self, *, available: bool, reason: str = "", host: str = "",
               devices: Iterable[GpuDevice] = ()) -> None:
        devices = list(devices)
        self._header = _line({"kind": "header", "format": FORMAT,
                              "format_version": FORMAT_VERSION, "available": available,
                              "reason": reason, "host": host,
                              "devices": [asdict(d) for d in devices]})
        with self._lock:
            self._available, self._reason, self._host = available, reason[:500], host
            self._devices = {d.index: d for d in devices}
            self.version += 1
        self._rewrite()

    def ranks(self, t: float, mapping: Mapping[int, RankGpu]) -> None:
        self._ranks = _line({"kind": "ranks", "t": t, "ranks": {
            str(r): {"index": g.index, "how": g.how} for r, g in sorted(mapping.items())}})
        with self._lock:
            self._mapping = dict(mapping)
            self.version += 1
        self._append([self._ranks])

    def error(self, reason: str) -> None:
        """Sampling stopped early: why (the report says so)."""
        self._error = _line({"kind": "error", "t": time.time(), "reason": reason[:500]})
        with self._lock:
            self._stopped = reason[:500]
            self.version += 1
        self._append([self._error])

    def samples(self, samples: Iterable[GpuSample]) -> None:
        # as a reader of the file takes them: non-finite readings are none
        samples = [_sample(asdict(s)) for s in samples]
        samples = [s for s in samples if s is not None]
        lines = [_line({"kind": "sample", **{k: v for k, v in asdict(s).items()
                                             if v is not None}}) for s in samples]
        with self._lock:
            self._samples.extend(lines)
            self._held.extend(samples)
            self.version += 1
        self._append(lines)

    def trace(self) -> GpuTrace:
        """What the file says now."""
        with self._lock:
            return GpuTrace(available=self._available, reason=self._reason, host=self._host,
                            devices=dict(self._devices), ranks=dict(self._mapping),
                            samples=tuple(sorted(self._held, key=lambda s: s.t)),
                            stopped=self._stopped)

    def _append(self, lines: list[str]) -> None:
        data = "".join(lines)
        if self._size + len(data) > self.max_bytes:
            with self._lock:
                for _ in range(len(self._samples) // 2):
                    self._samples.popleft()
                    self._held.popleft()
                self.version += 1
            self._rewrite()
            return
        with open(self.path, "a", encoding="utf-8") as f:
            f.write(data)
        self._size += len(data)

    def _rewrite(self) -> None:
        data = self._header + self._ranks + "".join(self._samples) + self._error
        write_atomic(self.path, data)
        self._size = len(data)


def _line(obj: dict[str, Any]) -> str:
    return json.dumps(obj, separators=(",", ":")) + "\n"


def read_gpu(directory: Path) -> GpuTrace | None:
    """The GPU samples of a capture directory; None if it has none. Raises ValueError (with the
    reason) for a file that is not ours."""
    path = directory / GPU_JSONL
    try:
        raw = read_regular(path, MAX_READ + 1, tail=True)  # the newest samples at most
        if len(raw) > MAX_READ:  # (the header is then read apart; a partial line dropped)
            head = read_regular(path, 1 << 20).split(b"\n", 1)[0]
            raw = raw.split(b"\n", 1)[-1]
        else:
            head = raw.split(b"\n", 1)[0]
    except FileNotFoundError:
        return None
    except OSError as err:
        raise ValueError(f"{path} cannot be read ({err.strerror})") from None
    header = _object(head)
    if header is None or header.get("format") != FORMAT or header.get("kind") != "header":
        raise ValueError(f"{path} is not an nccl-doctor GPU sample file")
    if header.get("format_version") != FORMAT_VERSION:
        raise ValueError(f"{path} has GPU sample format version {header.get('format_version')!r}; "
                         f"this nccl-doctor reads version {FORMAT_VERSION}")
    devices = {d.index: d for d in map(_device, _list(header.get("devices"))) if d is not None}
    ranks: dict[int, RankGpu] = {}
    samples, stopped = [], ""
    values, damaged = bounded_json.lines(raw)
    for obj in values:
        if not isinstance(obj, dict):
            continue
        if obj.get("kind") == "sample":
            s = _sample(obj)
            if s is not None:
                samples.append(s)
        elif obj.get("kind") == "ranks" and isinstance(obj.get("ranks"), dict):
            ranks = _ranks(obj["ranks"])
        elif obj.get("kind") == "error":
            stopped = str(obj.get("reason", ""))[:500]
    samples.sort(key=lambda s: s.t)
    return GpuTrace(available=header.get("available") is True,
                    reason=str(header.get("reason", ""))[:500], host=str(header.get("host", "")),
                    devices=devices, ranks=ranks, samples=tuple(samples), stopped=stopped,
                    damaged=damaged)


def _object(line: bytes) -> dict[str, Any] | None:
    try:
        obj = bounded_json.loads(line)
    except ValueError:
        return None
    return obj if isinstance(obj, dict) else None


def _list(value: Any) -> list:
    return value if isinstance(value, list) else []


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        return None
    return float(value)


def _index(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else None


def _device(obj: Any) -> GpuDevice | None:
    if not isinstance(obj, dict) or _index(obj.get("index")) is None:
        return None
    return GpuDevice(index=obj["index"], uuid=str(obj.get("uuid", ""))[:100],
                     name=str(obj.get("name", ""))[:100],
                     **{k: _number(obj.get(k)) for k in _DEVICE_FIELDS[3:]})


def _sample(obj: dict[str, Any]) -> GpuSample | None:
    t, index = _number(obj.get("t")), _index(obj.get("index"))
    if t is None or index is None:
        return None
    return GpuSample(t=t, index=index, **{k: _number(obj.get(k)) for k in _SAMPLE_FIELDS[2:]})


def _ranks(obj: dict[str, Any]) -> dict[int, RankGpu]:
    out = {}
    for key, value in obj.items():
        if not (key.isascii() and key.isdigit()) or not isinstance(value, dict):
            continue
        index = _index(value.get("index"))
        if index is not None:
            out[int(key)] = RankGpu(index, str(value.get("how", ""))[:40])
    return out
