"""The frameworks users train with, the real thing: Lightning, Accelerate, the transformers
``Trainer`` and DeepSpeed at their current releases (one cached virtual environment,
tests/upstream/envs.py ``FRAMEWORKS``), each job a user's script with a common mistake that
hangs it, and its ``--fixed`` twin. Each runs as a user runs it - ``nccl-doctor run -- python -m
torch.distributed.run --nproc-per-node N job.py`` (gloo on the CPU, a tiny model built from a
config, no hub) - and is read live (report.json) and in replay (``nccl-doctor replay --format
json``): the same verdict and root cause in both.

What a hang must say: the rank that took the branch on the rank is the culprit, the branch is
the ``if`` of the user's (its line read from the job's text, never written here), the user's
line is the framework call inside it, the framework's frames carry their release, the catalog
names the call; no side is described as "issued from C++". DeepSpeed's is known issue E at
DeepSpeed's own line."""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

import pytest

from envs import FRAMEWORKS, FRAMEWORKS_BUILD, python_for

JOBS = Path(__file__).parent / "jobs"
CLI = [sys.executable, "-m", "nccl_doctor"]
#: The releases every frame of theirs must name (tests/upstream/envs.py FRAMEWORKS).
VERSIONS = dict(pin.split("==") for pin in FRAMEWORKS)
BRANCH_KEYS = {"path", "line", "text", "kind", "function", "ranks", "skips"}

pytestmark = [pytest.mark.frameworks, pytest.mark.timeout(1800)]  # (the environment may be built)


@pytest.fixture(scope="module")
def python() -> Path:
    return python_for("frameworks", FRAMEWORKS, **FRAMEWORKS_BUILD)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run(python: Path, job: str, nproc: int, out: Path, *args: str) -> tuple[int, dict, dict]:
    """(exit status, report.json, the replay's report) of ``job`` under the doctor."""
    env = {**os.environ, "DS_ACCELERATOR": "cpu"}  # DeepSpeed's, read by the ds_ jobs only
    proc = subprocess.run(
        [*CLI, "run", "--out", str(out), "--", str(python), "-m", "torch.distributed.run",
         "--nproc-per-node", str(nproc), "--master-port", str(free_port()), str(JOBS / job),
         *args], capture_output=True, text=True, timeout=600, cwd=JOBS, env=env)
    assert (out / "report.json").is_file(), proc.stderr[-3000:]
    report = json.loads((out / "report.json").read_text())
    replay = subprocess.run([*CLI, "replay", "--format", "json", str(out)], capture_output=True,
                            text=True, timeout=120)
    assert replay.returncode == 0, replay.stderr[-2000:]
    return proc.returncode, report, json.loads(replay.stdout)


# -- reading the job's text and the report ----------------------------------------------------

def line_of(job: str, text: str, after: int = 0) -> int:
    """The number of the first line after line ``after`` of ``job`` that holds ``text``."""
    lines = (JOBS / job).read_text().splitlines()
    return next(n for n, line in enumerate(lines, 1) if n > after and text in line)


def function_at(job: str, line: int) -> str:
    """The name of the function whose body holds ``line``."""
    lines = (JOBS / job).read_text().splitlines()[:line]
    return next(m.group(1) for text in reversed(lines)
                if (m := re.match(r"\s*def (\w+)\(", text)))


def root(report: dict) -> dict:
    return next(f for f in report["findings"] if f["root_cause"])


def walk(value: Any) -> Iterator[tuple[str | None, Any]]:
    """Every (key, value) pair below ``value`` (key None for a list's items)."""
    if isinstance(value, dict):
        for k, v in value.items():
            yield k, v
            yield from walk(v)
    elif isinstance(value, list):
        for v in value:
            yield None, v
            yield from walk(v)


def frames(finding: dict) -> list[dict]:
    """The call path frames of a finding and of its sides."""
    out = list(finding.get("call_path") or [])
    for side in finding["evidence"].get("sides") or []:
        out += side.get("call_path") or []
    return out


def your_lines(finding: dict) -> list[str]:
    """The user's lines a finding names: its own and each side's."""
    ev = finding["evidence"]
    return [line for line in [ev.get("your_line"), finding.get("entry_callsite"),
                              *(s.get("your_line") for s in ev.get("sides") or [])] if line]


def assert_no_cpp_callsite(report: dict) -> None:
    cpp = [v for _, v in walk(report) if isinstance(v, str) and v.startswith("<issued from C++")]
    assert not cpp, cpp


def assert_versions(finding: dict, package: str | None = None) -> None:
    """Each frame of a pinned framework names its release; ``package``'s frames are there."""
    pinned = [f for f in frames(finding) if f.get("package") in VERSIONS]
    assert all(f["version"] == VERSIONS[f["package"]] for f in pinned), \
        [(f["package"], f["version"], f["function"]) for f in pinned]
    if package is not None:
        assert any(f["package"] == package for f in pinned), frames(finding)


def assert_catalog(finding: dict, call: str, package: str) -> None:
    calls = finding["evidence"].get("collective_calls") or []
    assert any(c.get("call") == call and c.get("package") == package
               and c.get("version") == VERSIONS[package] for c in calls), \
        (call, [(c.get("call"), c.get("version")) for c in calls])


def assert_same_root(report: dict, replay: dict) -> None:
    assert replay["verdict"] == report["verdict"]
    a, b = root(report), root(replay)
    keys = ("kind", "ranks", "group", "seq", "op", "callsite", "entry_callsite", "branch")
    assert {k: a.get(k) for k in keys} == {k: b.get(k) for k in keys}


# -- the hangs of a branch on the rank --------------------------------------------------------

@dataclass(frozen=True)
class RankBranch:
    job: str
    nproc: int
    branch: str  # the text of the user's ``if`` on the rank
    call: str  # the framework call inside it (the first line after the ``if`` that holds it)
    catalog: tuple[str, str]  # the collective library call the catalog names, and its package
    package: str  # the framework whose frames are on the call path

    def __str__(self) -> str:
        return f"{self.job.removesuffix('.py')}-{self.nproc}"


RANK_BRANCHES = [
    RankBranch("pl_checkpoint.py", 2, "if batch_idx == 3 and trainer.is_global_zero:",
               "trainer.save_checkpoint(", ("Trainer.save_checkpoint", "lightning"), "lightning"),
    RankBranch("pl_checkpoint.py", 4, "if batch_idx == 3 and trainer.is_global_zero:",
               "trainer.save_checkpoint(", ("Trainer.save_checkpoint", "lightning"), "lightning"),
    RankBranch("pl_log_rank_zero.py", 2, "if self.global_rank == 0:", 'self.log("train_loss"',
               ("LightningModule.log", "lightning"), "lightning"),
    RankBranch("pl_log_rank_zero.py", 4, "if self.global_rank == 0:", 'self.log("train_loss"',
               ("LightningModule.log", "lightning"), "lightning"),
    RankBranch("acc_wait.py", 2, "if accelerator.is_main_process:",
               "accelerator.wait_for_everyone()", ("Accelerator.wait_for_everyone", "accelerate"),
               "accelerate"),
    RankBranch("acc_gather_metrics.py", 2, "if is_main:", "accelerator.gather_for_metrics(",
               ("Accelerator.gather_for_metrics", "accelerate"), "accelerate"),
    RankBranch("hf_eval_on_main.py", 2,
               "if state.global_step == 2 and state.is_world_process_zero:",
               "self.trainer.evaluate()", ("Trainer.evaluate", "transformers"), "transformers"),
]


def assert_rank_branch(report: dict, case: RankBranch) -> None:
    assert report["verdict"] == "hang", [f["title"] for f in report["findings"]]
    f = root(report)
    assert f["ranks"] == [0], (f["ranks"], f["title"])  # the rank that took the branch
    if_line = line_of(case.job, case.branch)
    call_line = line_of(case.job, case.call, after=if_line)
    branch = f.get("branch")
    assert isinstance(branch, dict) and BRANCH_KEYS <= set(branch), branch
    assert branch["path"].endswith(f"/{case.job}") and branch["line"] == if_line, branch
    assert branch["text"].startswith(case.branch) and branch["kind"] == "if", branch
    assert branch["function"].endswith(function_at(case.job, if_line)), branch
    assert branch["ranks"] == [0] and branch["skips"] is False, branch
    ev = f["evidence"]
    if f["kind"] == "collective_mismatch":
        took = next(s for s in ev["sides"] if s["ranks"] == [0])
        assert (took.get("your_line") or "").endswith(f"{case.job}:{call_line}"), took
    else:
        assert f["kind"] == "missing_collective", f["kind"]
        assert (ev.get("your_line") or "").endswith(f"{case.job}:{call_line}"), ev
    assert_versions(f, case.package)
    assert_catalog(f, *case.catalog)
    assert_no_cpp_callsite(report)
    # the run points back (issue 51), the catalog matched by the releases the ranks ran
    assert (f["evidence"].get("check_rule") or {}).get("code") == "ND004", f["evidence"]


@pytest.mark.parametrize("case", RANK_BRANCHES, ids=str)
def test_a_branch_on_the_rank_names_the_rank_the_if_and_the_users_line(case, python, tmp_path):
    status, report, replay = run(python, case.job, case.nproc, tmp_path / "out")
    assert status != 0
    for r in (report, replay):
        assert_rank_branch(r, case)
    assert_same_root(report, replay)
    if case.job == "hf_eval_on_main.py":  # rank 1 is in DDP's broadcast, issued from C++
        train = line_of(case.job, "trainer.train()")
        others = [s for s in root(report)["evidence"].get("sides") or [] if 0 not in s["ranks"]]
        for side in others:  # described from its Python stack: the user's trainer.train()
            assert (side.get("your_line") or "").endswith(f"{case.job}:{train}"), side


# -- DeepSpeed ZeRO-3 generate (known issue E) ------------------------------------------------

def test_deepspeed_zero3_generate_is_known_issue_e_at_deepspeeds_line(python, tmp_path):
    job = "ds_generate.py"
    status, report, replay = run(python, job, 2, tmp_path / "out")
    assert status != 0
    generate = line_of(job, ".generate(")
    for r in (report, replay):
        assert r["verdict"] == "hang", [f["title"] for f in r["findings"]]
        f = root(r)
        known = f["evidence"].get("known_issue") or {}
        assert known.get("rule") == "E" and known.get("library") == "deepspeed 0.19.8", known
        assert "deepspeed/runtime/zero/partition_parameters.py" in f["callsite"], f["callsite"]
        assert not [s for s in [f["callsite"], *(x.get("callsite") for x in
                                                 f["evidence"].get("sides") or [])]
                    if s and "typing_extensions" in s]
        assert any(line.endswith(f"{job}:{generate}") for line in your_lines(f)), your_lines(f)
        assert_versions(f, "deepspeed")
        assert_catalog(f, "GenerationMixin.generate", "transformers")
        assert_no_cpp_callsite(r)
        said = f["evidence"].get("check_rule") or {}
        assert (said.get("code"), said.get("line")) == ("ND005", generate), f["evidence"]
        assert "`nccl-doctor check` finds this before the run: ND005" in f["detail"]
    assert_same_root(report, replay)


# -- the fixed twins --------------------------------------------------------------------------

HEALTHY = ["pl_checkpoint.py", "pl_log_rank_zero.py", "acc_wait.py", "acc_gather_metrics.py",
           "hf_eval_on_main.py", "ds_generate.py"]


@pytest.mark.parametrize("job", HEALTHY)
def test_the_fixed_job_reads_ok(job, python, tmp_path):
    status, report, replay = run(python, job, 2, tmp_path / "out", "--fixed")
    assert status == 0, [f["title"] for f in report["findings"]]
    for r in (report, replay):
        assert r["verdict"] == "ok" and r["findings"] == [], [f["title"] for f in r["findings"]]
        assert [x["state"] for x in r["ranks"]] == ["exited", "exited"]
        assert not [k for k, _ in walk(r) if k == "branch"]
