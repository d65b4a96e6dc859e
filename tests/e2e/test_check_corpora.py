"""``nccl-doctor check``'s precision on code nobody here wrote: the installed accelerate, TRL
and transformers (about 1.3 million lines, full of ``if self.is_main_process:`` blocks that only
log or write files). Every finding on them is triaged in docs/check.md (none is a real hang:
the one-rank-first idiom, a guard every rank takes alike); the goal is at most one false finding
per 50,000 lines, and this test fails when they grow past it (a new release read, or the rules
loosened): triage them again then."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

PACKAGES = ("accelerate", "trl", "transformers")
PER_FALSE = 50_000  # lines per false finding allowed


def _root(name: str) -> Path:
    spec = importlib.util.find_spec(name)
    assert spec is not None and spec.origin, f"{name} is installed with the test extra"
    return Path(spec.origin).parent


def test_findings_on_the_installed_libraries_stay_under_the_goal():
    """The rate is over the corpus, as the goal is: the three packages together."""
    roots = [_root(p) for p in PACKAGES]
    lines = sum(len(p.read_bytes().splitlines()) for r in roots for p in r.rglob("*.py"))
    proc = subprocess.run([sys.executable, "-m", "nccl_doctor", "check", "--format", "json",
                           *map(str, roots)], capture_output=True, text=True, timeout=900)
    assert proc.returncode in (0, 1), proc.stderr
    report = json.loads(proc.stdout)
    assert report["files"] > 1000 and lines > 500_000, (report["files"], lines)
    found = [f"{f['path']}:{f['line']} {f['code']}" for f in report["findings"]]
    assert len(found) <= lines // PER_FALSE, (lines, found)
