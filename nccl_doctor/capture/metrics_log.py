"""Training metrics from a job's printed log (``nccl-doctor replay DIR --log FILE``). Pure.

Reads the lines that common trainers print, never executing anything from them:

- Python dict reprs, as transformers' Trainer (so TRL) and ms-swift print them:
  ``{'loss': 0.0, 'reward': 1.0, 'reward_std': 0.0, 'kl': 0.0, 'epoch': 0.01}``;
- JSON objects, one per line (ms-swift's logging.jsonl, many loggers);
- ``key=value`` / ``key: value`` lists, as OpenRLHF's tqdm postfix prints them:
  ``policy_loss=0, reward=1, kl=0, ...`` (only when at least two metric names are on the line).

Dicts are read with ``ast.literal_eval`` (literals only) and lines are cut at MAX_LINE.
"""

from __future__ import annotations

import ast
import json
import math
import re
from pathlib import Path
from typing import Iterable, Iterator, Mapping

MAX_LINE = 20_000  # characters of one line that are looked at
_METRIC_WORDS = re.compile(r"loss|reward|kl|adv|entropy|grad_norm", re.I)
# one way only to match a number (no nested quantifiers to backtrack through)
_PAIR = re.compile(
    r"(?<![\w/.])([A-Za-z_][\w/.]{0,100})\s*[=:]\s*"
    r"(-?(?:\d{1,40}(?:\.\d{0,40})?|\.\d{1,40})(?:[eE][-+]?\d{1,4})?)(?![\w.])"
)
PAIRS_LINE = 4096  # characters of a line searched for key=value pairs
_STEP_KEYS = ("step", "global_step", "train/global_step")

Row = tuple[int | None, Mapping[str, float]]


def parse_lines(lines: Iterable[str]) -> list[Row]:
    rows: list[Row] = []
    for raw in lines:
        for line in raw[:MAX_LINE].split("\r"):  # tqdm redraws a line with carriage returns
            metrics = _parse(line.strip())
            if metrics:
                rows.append((_step(metrics, len(rows) + 1), metrics))
    return rows


def parse_file(path: Path) -> list[Row]:
    with path.open("r", encoding="utf-8", errors="replace") as fh:
        return parse_lines(_lines(fh))


def _lines(fh) -> Iterator[str]:
    """Lines of at most MAX_LINE characters; the rest of a longer line is skipped unread into
    memory (a log with no newlines is not loaded whole)."""
    while True:
        line = fh.readline(MAX_LINE)
        if not line:
            return
        if not line.endswith("\n") and len(line) == MAX_LINE:
            while (rest := fh.readline(MAX_LINE)) and not rest.endswith("\n"):
                pass
        yield line


def _parse(line: str) -> dict[str, float] | None:
    start, end = line.find("{"), line.rfind("}")
    if 0 <= start < end:
        found = _literal(line[start:end + 1])
        if found is not None:
            return found
    pairs = {}
    for k, v in _PAIR.findall(line[:PAIRS_LINE]):
        value = float(v)
        if math.isfinite(value):
            pairs[k] = value
    if sum(1 for k in pairs if _METRIC_WORDS.search(k)) >= 2:
        return pairs
    return None


def _literal(text: str) -> dict[str, float] | None:
    value: object
    try:
        value = json.loads(text)
    except (ValueError, RecursionError):
        try:
            value = ast.literal_eval(text)
        except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
            return None
    if not isinstance(value, dict):
        return None
    numbers = dict(_flat(value))
    if not any(_METRIC_WORDS.search(k) for k in numbers):
        return None
    return numbers


def _flat(d: Mapping, prefix: str = "", depth: int = 0) -> Iterator[tuple[str, float]]:
    for k, v in d.items():
        key = f"{prefix}{k}"
        if isinstance(v, bool):
            continue
        if isinstance(v, (int, float, str)):  # recent transformers print {'loss': '0', ...}
            try:
                number = float(v)
            except (ValueError, OverflowError):
                continue
            if math.isfinite(number):
                yield key, number
        elif isinstance(v, Mapping) and depth < 4:
            yield from _flat(v, key + "/", depth + 1)


def _step(metrics: Mapping[str, float], fallback: int) -> int:
    for key in _STEP_KEYS:
        value = metrics.get(key)
        if value is not None and math.isfinite(value) and abs(value) < 2**62:
            return int(value)
    return fallback
