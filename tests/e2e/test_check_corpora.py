"""``nccl-doctor check``'s precision on code nobody here wrote: the installed accelerate, TRL,
transformers and torch's distributed packages (about 1.46 million lines, full of ``if
self.is_main_process:`` blocks that only log or write files, and - in torch's - of the
collectives' own plumbing: ways out for the ranks outside a group, chosen source ranks,
asserts written out). Every finding on them is triaged in docs/check.md (``TRIAGED`` here, with
the verdict); the goal is at most one false finding per 50,000 lines. The test fails when a
finding appears or goes that is not triaged (a new release read, or the rules changed): triage
them again then."""

from __future__ import annotations

import importlib.util
import json
from collections import Counter
import subprocess
import sys
from pathlib import Path

PACKAGES = ("accelerate", "trl", "transformers", "torch.distributed")
PER_FALSE = 50_000  # lines per false finding allowed

# (file under site-packages, rule, call) -> (how many, the verdict docs/check.md gives them)
TRIAGED = {
    ("accelerate/utils/fsdp_utils.py", "ND003", "accelerator.wait_for_everyone"):
        (1, "worth a run"),
    ("accelerate/test_utils/scripts/test_script.py", "ND003",
     "accelerator.wait_for_everyone"): (1, "by design"),
    ("transformers/trainer_pt_utils.py", "ND001", "dist.barrier"): (2, "by design"),
    ("torch/distributed/optim/zero_redundancy_optimizer.py", "ND002", "_broadcast_object"):
        (2, "false"),
    ("torch/distributed/tensor/_api.py", "ND002", "check_tensor_meta"): (1, "true"),
}


def _root(name: str) -> Path:
    spec = importlib.util.find_spec(name)
    assert spec is not None and spec.origin, f"{name} is installed with the test extra"
    return Path(spec.origin).parent


def test_findings_on_the_installed_libraries_stay_under_the_goal():
    """The rate is over the corpus, as the goal is: the four packages together."""
    roots = [_root(p) for p in PACKAGES]
    lines = sum(len(p.read_bytes().splitlines()) for r in roots for p in r.rglob("*.py"))
    proc = subprocess.run([sys.executable, "-m", "nccl_doctor", "check", "--format", "json",
                           *map(str, roots)], capture_output=True, text=True, timeout=900)
    assert proc.returncode in (0, 1), proc.stderr
    report = json.loads(proc.stdout)
    assert report["files"] > 1000 and lines > 500_000, (report["files"], lines)
    found = [(f["path"].split("site-packages/")[-1], f["code"], f["call"])
             for f in report["findings"]]
    counted = {key: n for key, (n, _) in TRIAGED.items()}
    assert Counter(found) == counted, ("triage these again in docs/check.md",
                                       Counter(found), counted)
    false = [f for f in found if TRIAGED[f][1] != "true"]
    assert len(false) <= lines // PER_FALSE, (lines, false)
