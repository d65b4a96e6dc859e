"""``nccl-doctor check`` as a pre-commit hook, run by the real pre-commit (``pre-commit
try-repo`` on this repository's .pre-commit-hooks.yaml) in a temporary git repository: a commit
holding a collective under ``if rank == 0:`` fails with the finding; a clean one passes."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent


def git(repo: Path, *args: str) -> None:
    subprocess.run(["git", "-c", "user.email=ci@example.invalid", "-c", "user.name=ci", *args],
                   cwd=repo, check=True, capture_output=True)


def test_the_hook_fails_a_commit_with_a_rank_only_collective_and_passes_a_clean_one(tmp_path):
    repo = tmp_path / "project"
    repo.mkdir()
    (repo / "bad.py").write_text("import torch.distributed as dist\n\n\ndef main(rank):\n"
                                 "    if rank == 0:\n        dist.barrier()\n")
    (repo / "good.py").write_text("import torch.distributed as dist\n\n\ndef main():\n"
                                  "    dist.barrier()\n")
    git(repo, "init", "-q")
    git(repo, "add", ".")
    git(repo, "commit", "-qm", "init")
    env = dict(os.environ, PATH=f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}",
               PRE_COMMIT_HOME=str(tmp_path / "cache"))

    def hook(*files: str) -> subprocess.CompletedProcess:
        return subprocess.run([str(BIN / "pre-commit"), "try-repo", str(ROOT),
                               "nccl-doctor-check", "--files", *files], cwd=repo, env=env,
                              capture_output=True, text=True, timeout=300)

    failed = hook("bad.py")
    assert failed.returncode == 1, failed.stdout + failed.stderr
    assert "bad.py:6:9: ND001 `dist.barrier` is a collective" in failed.stdout, failed.stdout
    passed = hook("good.py")
    assert passed.returncode == 0, passed.stdout + passed.stderr
    assert "nccl-doctor check" in passed.stdout and "Passed" in passed.stdout
