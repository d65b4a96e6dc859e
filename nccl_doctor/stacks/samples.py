"""``stragglers.jsonl``: stack samples of late ranks, taken while their peers waited for them.

One JSON object per line: ``{"t": unix seconds, "rank": int, "frames": ["path:line in fn", ...]
(the rank's own code, innermost first), "waiting": [ranks], "source": "py-spy"|"agent"}``. The
writer stops at ``MAX_PER_RANK`` samples per rank; the reader skips what it cannot trust.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from nccl_doctor import bounded_json
from nccl_doctor.files import read_regular
from nccl_doctor.capture.names import STRAGGLERS_JSONL

MAX_PER_RANK = 60
MAX_READ = 1 << 20


@dataclass(frozen=True)
class StackSample:
    t: float
    rank: int
    frames: tuple[str, ...]  # innermost first: the rank's own code, then what called it
    waiting: tuple[int, ...]  # the peers waiting in a collective when it was taken
    source: str


class SampleLog:
    """Appends samples to ``stragglers.jsonl`` (the supervisor's straggler watch writes it)."""

    def __init__(self, directory: Path) -> None:
        self.path = directory / STRAGGLERS_JSONL
        self.counts: dict[int, int] = {}
        self.held: list[StackSample] = []  # what the file holds (never read back)

    def full(self, rank: int) -> bool:
        return self.counts.get(rank, 0) >= MAX_PER_RANK

    def add(self, sample: StackSample) -> None:
        if self.full(sample.rank):
            return
        self.counts[sample.rank] = self.counts.get(sample.rank, 0) + 1
        self.held.append(sample)
        line = json.dumps({"t": sample.t, "rank": sample.rank, "frames": list(sample.frames),
                           "waiting": list(sample.waiting), "source": sample.source})
        with open(self.path, "a", encoding="utf-8") as f:
            f.write(line + "\n")


def read_samples(directory: Path) -> tuple[tuple[StackSample, ...], str]:
    """The samples beside a capture (none when there is no file), and what was wrong with the
    lines that were skipped ("" when none was)."""
    try:
        raw = read_regular(directory / STRAGGLERS_JSONL, MAX_READ)
    except FileNotFoundError:
        return (), ""
    except OSError as err:
        return (), f"cannot be read ({err.strerror})"
    values, damaged = bounded_json.lines(raw)
    out = []
    for obj in values:
        sample = _sample(obj) if isinstance(obj, dict) else None
        if sample is not None:
            out.append(sample)
    return tuple(out), damaged


def _sample(obj: dict[str, Any]) -> StackSample | None:
    t, rank, frames, waiting = obj.get("t"), obj.get("rank"), obj.get("frames"), obj.get("waiting")
    if (not isinstance(t, (int, float)) or isinstance(t, bool) or not math.isfinite(t)
            or not isinstance(rank, int) or isinstance(rank, bool) or rank < 0
            or not isinstance(frames, list) or not all(isinstance(x, str) for x in frames)
            or not isinstance(waiting, list)
            or not all(isinstance(x, int) and not isinstance(x, bool) for x in waiting)):
        return None
    return StackSample(float(t), rank, tuple(x[:300] for x in frames[:8]), tuple(waiting),
                       str(obj.get("source", ""))[:20])
