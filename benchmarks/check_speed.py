"""How long ``nccl-doctor check`` takes, as a user runs it (a fresh process each time): one
training script with its own helpers (tests/integration/jobs/branches.py and
branch_helpers.py), then the whole installed transformers package.

    python benchmarks/check_speed.py [--rounds 3] [--no-transformers]

Goals (issue 51): a training script with its imports <= 1 s; the whole installed transformers
<= 60 s on 2 cores. The last line is

  check_speed script_s=S transformers_s=T transformers_files=N
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = [ROOT / "tests/integration/jobs/branches.py",
          ROOT / "tests/integration/jobs/branch_helpers.py"]


def timed(paths: list[Path]) -> tuple[float, dict]:
    t = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "nccl_doctor", "check", "--format", "json",
                           *map(str, paths)], capture_output=True, text=True)
    took = time.perf_counter() - t
    assert proc.returncode in (0, 1), proc.stderr
    return took, json.loads(proc.stdout)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--no-transformers", action="store_true")
    args = ap.parse_args()
    script = [timed(SCRIPT)[0] for _ in range(args.rounds)]
    print(f"training script (2 files): median {statistics.median(script):.2f} s, "
          f"min {min(script):.2f} s (goal 1 s)")
    tf_s, files = float("nan"), 0
    if not args.no_transformers:
        spec = importlib.util.find_spec("transformers")
        root = Path(spec.origin).parent
        tf_s, report = timed([root])
        files = report["files"]
        print(f"transformers ({files} files): {tf_s:.1f} s, {len(report['findings'])} findings "
              "(goal 60 s)")
    print(f"check_speed script_s={statistics.median(script):.2f} transformers_s={tf_s:.1f} "
          f"transformers_files={files}")


if __name__ == "__main__":
    main()
