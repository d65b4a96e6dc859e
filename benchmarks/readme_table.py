"""Build the README's performance table from the benchmarks' latest figures.

    python benchmarks/readme_table.py [--check] [--results FILE] [--readme FILE]

Reads docs/benchmarks/results.txt (each benchmark's summary line, written by a run with
NCCL_DOCTOR_BENCH_RECORD=1: benchmarks/_results.py) and writes the table between the README's
``<!-- performance:begin -->`` and ``<!-- performance:end -->``. ``--check`` writes nothing and
exits 1 when the README's table is not the one the figures make (a test runs it).
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _results import RESULTS, read  # noqa: E402

README = Path(__file__).resolve().parent.parent / "README.md"
BEGIN, END = "<!-- performance:begin -->", "<!-- performance:end -->"

Figures = dict[str, str]


@dataclass(frozen=True)
class Row:
    figure: str
    goal: str
    benchmark: str
    measured: Callable[[Figures], str]
    met: Callable[[Figures], bool]


def _f(r: Figures, key: str) -> float:
    return float(r[key].rstrip("%").removesuffix("ms"))


ROWS = (
    Row("certain deadlock at 1,024 nodes x 8 ranks, authenticated: last progress to report",
        "<= 3 s", "federation",
        lambda r: f"{_f(r, 'deadlock_look_s'):.2f} s",
        lambda r: _f(r, "deadlock_look_s") <= 3.0),
    Row("a slow node named live at 1,024 nodes", "every node looked at every 10 s",
        "federation",
        lambda r: f"every node's digest read in {_f(r, 'digests_s'):.2f} s, the slow node "
                  f"named in {_f(r, 'waits_s'):.2f} s more",
        lambda r: _f(r, "digests_s") + _f(r, "waits_s") <= 10.0 and r.get("slow") == "right"),
    Row("supervisor CPU while 64 local ranks wait", "<= 1% of a core", "supervisor_ranks",
        lambda r: f"{r['wait']} of a core",
        lambda r: int(r["ranks"]) >= 64 and _f(r, "wait") <= 1.0),
    Row("replay, 1,024 ranks x 10,000 collectives", "<= 5 s, peak <= 1 GiB", "replay_scale",
        lambda r: f"{_f(r, 'replay_s'):.2f} s, peak {_f(r, 'replay_mib'):,.0f} MiB",
        lambda r: _f(r, "replay_s") <= 5.0 and _f(r, "replay_mib") <= 1024),
    Row("those calls into the DataFrame (`open(DIR).calls`)", "<= 4 s", "dataframe_scale",
        lambda r: f"{_f(r, 'calls_s'):.2f} s, peak {_f(r, 'calls_mib'):,.0f} MiB",
        lambda r: _f(r, "calls_s") <= 4.0),
    Row("their Parquet export", "<= 3 s", "dataframe_scale",
        lambda r: f"{_f(r, 'export_s'):.2f} s, peak {_f(r, 'export_mib'):,.0f} MiB",
        lambda r: _f(r, "export_s") <= 3.0),
    Row("a functional collective recorded (DTensor, TP, compiled graphs)", "<= 2 us a call",
        "functional_overhead",
        lambda r: f"+{_f(r, 'issue_us'):.2f} us issue, +{_f(r, 'wait_us'):.2f} us wait "
                  f"({r['kernel']} kernel)",
        lambda r: max(_f(r, "issue_us"), _f(r, "wait_us")) <= 2.0),
    Row("`run` on a trivial 2-rank job", "<= +0.1 s wall, <= +0.2 s CPU", "run_edges",
        lambda r: f"+{_f(r, 'added_wall_s'):.2f} s wall, +{_f(r, 'added_cpu_s'):.2f} s CPU",
        lambda r: _f(r, "added_wall_s") <= 0.1 and _f(r, "added_cpu_s") <= 0.2),
)


def table(figures: dict[str, Figures]) -> str:
    lines = ["| figure | goal | measured | met | benchmark (date, machine) |",
             "|---|---|---|---|---|"]
    for row in ROWS:
        r = figures.get(row.benchmark)
        link = f"[{row.benchmark}](docs/benchmarks/{row.benchmark}.md)"
        if r is None:
            lines.append(f"| {row.figure} | {row.goal} | not measured | - | {link} |")
            continue
        when = f"{r.get('date', '?')}, {r.get('machine', '?').replace('_', ' ')}"
        lines.append(f"| {row.figure} | {row.goal} | {row.measured(r)} | "
                     f"{'yes' if row.met(r) else '**no**'} | {link} ({when}) |")
    return "\n".join(lines)


def rebuilt(readme: str, figures: dict[str, Figures]) -> str:
    """``readme`` with the table between its markers made from ``figures``."""
    start, end = readme.find(BEGIN), readme.find(END)
    if start < 0 or end < start:
        raise SystemExit(f"the README has no {BEGIN} ... {END} section")
    return readme[:start + len(BEGIN)] + "\n" + table(figures) + "\n" + readme[end:]


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--check", action="store_true",
                   help="exit 1 if the README's table is not the one the figures make")
    p.add_argument("--results", type=Path, default=RESULTS)
    p.add_argument("--readme", type=Path, default=README)
    a = p.parse_args()
    text = a.readme.read_text()
    new = rebuilt(text, read(a.results))
    if a.check:
        if new != text:
            sys.stderr.write(f"{a.readme}: the performance table is not the one {a.results} "
                             "makes: run `make readme-table`\n")
            return 1
        return 0
    a.readme.write_text(new)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
