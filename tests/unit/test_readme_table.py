"""The README's performance table is the one the benchmarks' recorded figures make."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"
sys.path.insert(0, str(BENCHMARKS))

import _results  # noqa: E402
import readme_table  # noqa: E402


def test_the_readme_s_table_is_the_one_the_recorded_figures_make():
    run = subprocess.run([sys.executable, str(BENCHMARKS / "readme_table.py"), "--check"],
                         capture_output=True, text=True)
    assert run.returncode == 0, run.stderr
    figures = _results.read()
    readme = readme_table.README.read_text()
    for row in readme_table.ROWS:  # every figure of the table was measured and is shown
        assert row.benchmark in figures, row.benchmark
        assert row.measured(figures[row.benchmark]) in readme


def test_a_recorded_line_replaces_its_benchmark_s_own_and_the_table_follows(tmp_path,
                                                                           monkeypatch):
    results = tmp_path / "results.txt"
    monkeypatch.setattr(_results, "RESULTS", results)
    monkeypatch.setenv(_results.RECORD, "1")
    _results.record("run_edges added_wall_s=0.40 added_cpu_s=0.70")
    _results.record("replay_scale replay_s=3.50 replay_mib=427")
    _results.record("run_edges added_wall_s=0.08 added_cpu_s=0.15")
    figures = _results.read(results)
    assert set(figures) == {"run_edges", "replay_scale"}
    assert figures["run_edges"]["added_wall_s"] == "0.08" and figures["run_edges"]["date"]
    readme = tmp_path / "README.md"
    readme.write_text(f"intro\n{readme_table.BEGIN}\nold\n{readme_table.END}\nrest\n")
    assert subprocess.run([sys.executable, str(BENCHMARKS / "readme_table.py"), "--check",
                           "--results", str(results), "--readme", str(readme)],
                          capture_output=True).returncode == 1
    subprocess.run([sys.executable, str(BENCHMARKS / "readme_table.py"), "--results",
                    str(results), "--readme", str(readme)], check=True)
    text = readme.read_text()
    assert text.startswith("intro\n") and text.endswith("rest\n") and "old" not in text
    assert "| +0.08 s wall, +0.15 s CPU | yes |" in text  # met: within both goals
    assert "| 3.50 s, peak 427 MiB | yes |" in text
    assert "| not measured | - | [federation]" in text


def test_a_run_without_the_variable_records_nothing(tmp_path, monkeypatch):
    monkeypatch.setattr(_results, "RESULTS", tmp_path / "results.txt")
    monkeypatch.delenv(_results.RECORD, raising=False)
    _results.record("run_edges added_wall_s=0.40 added_cpu_s=0.70")
    assert not (tmp_path / "results.txt").exists()


@pytest.mark.parametrize("wall, cpu, met", [("0.25", "0.15", False), ("0.05", "0.60", False),
                                            ("0.10", "0.20", True)])
def test_a_goal_of_two_figures_is_met_only_by_both(wall, cpu, met):
    row = next(r for r in readme_table.ROWS if r.benchmark == "run_edges")
    assert row.met({"added_wall_s": wall, "added_cpu_s": cpu}) is met
