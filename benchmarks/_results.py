"""The benchmarks' latest figures, kept for the README's performance table.

Each benchmark prints a summary line last (``NAME key=value ...``). Run with
``NCCL_DOCTOR_BENCH_RECORD=1``, it also writes that line, with the date and the machine, into
``docs/benchmarks/results.txt`` in place of its previous one; ``benchmarks/readme_table.py``
builds the README's table from that file (``make readme-table``), and a test checks that the two
agree.
"""

from __future__ import annotations

import datetime
import os
import re
from pathlib import Path

RESULTS = Path(__file__).resolve().parent.parent / "docs" / "benchmarks" / "results.txt"
RECORD = "NCCL_DOCTOR_BENCH_RECORD"
_HEADER = """\
# The latest summary line of each benchmark: the figures of the README's performance table.
# Written by a benchmark run with NCCL_DOCTOR_BENCH_RECORD=1 (each replaces its own line);
# the table is built from them by benchmarks/readme_table.py. Lines are `NAME key=value ...`.
"""


def machine() -> str:
    """This machine in one word: its cores and its CPU's model name."""
    model = "unknown CPU"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    model = re.sub(r"\(R\)|\(TM\)|CPU|@.*", "", model)
    return f"{os.cpu_count()}-core_" + "_".join(model.split())


def record(line: str) -> None:
    """Print nothing; with NCCL_DOCTOR_BENCH_RECORD=1, keep ``line`` (a summary line) as its
    benchmark's latest in docs/benchmarks/results.txt."""
    if os.environ.get(RECORD) != "1":
        return
    name = line.split(None, 1)[0]
    stamped = f"{line.strip()} date={datetime.date.today().isoformat()} machine={machine()}"
    kept = []
    if RESULTS.is_file():
        kept = [x for x in RESULTS.read_text().splitlines()
                if x and not x.startswith("#") and x.split(None, 1)[0] != name]
    RESULTS.write_text(_HEADER + "\n".join(sorted(kept + [stamped])) + "\n")
    print(f"(recorded in {RESULTS})")


def read(path: Path = RESULTS) -> dict[str, dict[str, str]]:
    """Each benchmark's latest figures: ``{name: {key: value}}``."""
    out: dict[str, dict[str, str]] = {}
    for line in path.read_text().splitlines():
        if not line.strip() or line.startswith("#"):
            continue
        name, *pairs = line.split()
        out[name] = dict(p.split("=", 1) for p in pairs if "=" in p)
    return out
