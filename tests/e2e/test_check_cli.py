"""``nccl-doctor check`` as users run it (a subprocess): every branch on the rank that the run
names for the jobs of tests/integration (test_branch_jobs.py's cases, the mesh jobs' skips) is
found before the run, at the same line; the healthy jobs are clean; the documented exit
statuses and the JSON form."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.integration.test_branch_jobs import CASES, line_of

JOBS = Path(__file__).resolve().parents[1] / "integration" / "jobs"
CLI = [sys.executable, "-m", "nccl_doctor", "check"]


def check(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([*CLI, *args], capture_output=True, text=True, timeout=120)


@pytest.fixture(scope="module")
def jobs_report() -> dict:
    proc = check("--format", "json", str(JOBS))
    assert proc.returncode == 1, proc.stderr
    return json.loads(proc.stdout)


def conditions(report: dict) -> set[tuple[str, int]]:
    return {(Path(f["path"]).name, f["condition"]["line"]) for f in report["findings"]}


@pytest.mark.parametrize("scenario", sorted(CASES))
def test_the_runs_branch_on_the_rank_is_found_before_the_run(jobs_report, scenario):
    _, where, text, after, _ = CASES[scenario]
    assert (where.name, line_of(where, text, after)) in conditions(jobs_report), scenario


@pytest.mark.parametrize("script,text,after", [
    ("mesh_3d.py", "if rank != skip_rank or step != skip_step:", None),
    ("mesh_roles.py", "if not (step == 2 and dist.get_rank() == skipper):", None),
    ("group_creation.py", "if rank in (0, 1):", None),
    ("group_creation.py", "if rank < 2:", 'scenario == "order"'),  # ND006: another order
    ("group_creation.py", "if rank != world - 1:", 'scenario == "subgroups"'),
    ("group_creation.py", "if rank != 1:", 'scenario == "mesh_subset"'),  # init_device_mesh
    ("interprocedural.py", "if is_main():", 'scenario == "helper_return"'),
    ("interprocedural.py", "if self.is_main:", "def step"),  # an attribute set from the rank
    ("interprocedural.py", "if is_main:", "def share"),  # a caller's rank-derived argument
])
def test_the_mesh_and_group_skips_are_found(jobs_report, script, text, after):
    assert (script, line_of(JOBS / script, text, after)) in conditions(jobs_report)


@pytest.mark.parametrize("script", ["clean.py", "nan_guard.py", "pipeline_p2p.py",
                                    "step_skew.py", "no_collectives.py"])
def test_jobs_with_no_rank_branch_around_a_collective_are_clean(script):
    proc = check(str(JOBS / script))
    assert proc.returncode == 0, proc.stdout
    assert proc.stdout == "" and "no finding in 1 file" in proc.stderr, proc.stderr


def test_the_console_line_and_the_exit_statuses(tmp_path):
    bad = tmp_path / "train.py"
    bad.write_text("import torch.distributed as dist\n\n\ndef main(rank):\n"
                   "    if rank == 0:\n        dist.barrier()\n")
    proc = check(str(bad))
    assert proc.returncode == 1
    assert proc.stdout.startswith(f"{bad}:6:9: ND001 `dist.barrier` is a collective under the "
                                  "rank-dependent condition at line 5 (`if rank == 0:`"), proc.stdout
    assert "1 finding in 1 file" in proc.stderr
    missing = check(str(tmp_path / "nope.py"))
    assert missing.returncode == 3 and missing.stdout == ""
    assert missing.stderr.count("\n") == 1 and "does not exist" in missing.stderr
    usage = check("--format", "yaml", str(bad))
    assert usage.returncode == 2 and "Traceback" not in usage.stderr


def test_sarif_is_valid_sarif_2_1_0_and_says_each_finding(tmp_path):
    import jsonschema

    schema = json.loads((Path(__file__).resolve().parents[1] / "fixtures" / "sarif"
                         / "sarif-schema-2.1.0.json").read_text())
    bad = tmp_path / "bad.py"
    bad.write_bytes(b"def broken(:\n")
    proc = check("--format", "sarif", str(JOBS / "branches.py"), str(bad))
    assert proc.returncode == 1, proc.stderr
    log = json.loads(proc.stdout)
    jsonschema.Draft4Validator(schema).validate(log)
    (run,) = log["runs"]
    text = check("--format", "json", str(JOBS / "branches.py")).stdout
    assert [(r["ruleId"], r["locations"][0]["physicalLocation"]["region"]["startLine"])
            for r in run["results"]] == [(f["code"], f["line"])
                                         for f in json.loads(text)["findings"]]
    (note,) = run["invocations"][0]["toolExecutionNotifications"]
    assert "bad.py: not Python" in note["message"]["text"]
    # the validator does reject what is not SARIF
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.Draft4Validator(schema).validate(dict(log, version="2.0.0"))


def test_a_launch_command_is_checked_with_the_modules_of_yours_it_imports(tmp_path):
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "__init__.py").write_text("")
    (tmp_path / "pkg" / "helpers.py").write_text(
        "import torch.distributed as dist\n\n\ndef save():\n    dist.barrier()\n")
    (tmp_path / "train.py").write_text(
        "import torch.distributed as dist\nimport numpy\nfrom pkg.helpers import save\n\n\n"
        "def main():\n    if dist.get_rank() == 0:\n        save()\n")

    def run(*argv: str) -> subprocess.CompletedProcess:
        return subprocess.run([*CLI, "--", *argv], capture_output=True, text=True,
                              timeout=120, cwd=tmp_path)

    for argv in (["torchrun", "--nproc-per-node", "2", "train.py"], ["python", "-m", "train"]):
        proc = run(*argv)
        assert proc.returncode == 1, proc.stderr
        assert proc.stdout.startswith("train.py:8:9: ND002 `save` makes collectives "
                                      "(pkg/helpers.py:5 dist.barrier)"), proc.stdout
        assert "1 finding in 2 files" in proc.stderr  # (numpy: a library's, not read)
    nothing = run("torchrun", "--nproc-per-node", "2")
    assert nothing.returncode == 2 and "no Python script in the command" in nothing.stderr


FRAMEWORKS = Path(__file__).resolve().parents[1] / "frameworks" / "jobs"


@pytest.mark.parametrize("script,text", [
    ("acc_wait.py", "if accelerator.is_main_process:"),
    ("acc_gather_metrics.py", "if is_main:"),
    ("hf_eval_on_main.py", "if state.global_step == 2 and state.is_world_process_zero:"),
])
def test_the_frameworks_jobs_library_calls_are_found(script, text):
    """The frameworks tier's jobs whose hang is a catalogued library call made on the main
    process only (accelerate and transformers are installed with the project)."""
    proc = check("--format", "json", str(FRAMEWORKS / script))
    assert proc.returncode == 1, proc.stderr
    (f,) = json.loads(proc.stdout)["findings"]
    assert f["code"] == "ND004" and f["condition"]["line"] == line_of(FRAMEWORKS / script, text)


def test_group_creation_says_the_four_skips_and_not_the_healthy_or_local_groups(jobs_report):
    """group_creation.py's healthy scenario and its ``use_local_synchronization=True`` group
    (made by its members only, as torch allows) are not said; its four bugs are."""
    script = JOBS / "group_creation.py"
    said = sorted(line for name, line in conditions(jobs_report) if name == script.name)
    assert said == sorted([line_of(script, "if rank in (0, 1):"),
                           line_of(script, "if rank < 2:", 'scenario == "order"'),
                           line_of(script, "if rank != world - 1:"),
                           line_of(script, "if rank != 1:")]), said
