"""``check --diff`` / ``--fix`` (nccl_doctor/check/fixes.py) on sources written here: the
collective moved out of the rank condition's arm (before it when first, after it when last),
the user's formatting and comments kept; ``synced_gpus=True`` added; every fix that could
change what the program computes refused, with why; checked again, what was fixed is gone."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from nccl_doctor.check import check_paths
from nccl_doctor.check.fixes import fix_files

CLI = [sys.executable, "-m", "nccl_doctor", "check"]


def fixed(tmp_path: Path, text: str, name: str = "train.py"):
    path = tmp_path / name
    path.write_text(text)
    report = check_paths([path])
    assert report.findings, "nothing to fix: the case is wrong"
    (ff,) = fix_files(report.findings)
    return ff


def test_a_collective_last_in_its_arm_goes_after_the_if_first_before_it_comments_kept(tmp_path):
    ff = fixed(tmp_path, """\
import torch.distributed as dist


def main(t, rank):
    # rank 0 saves, then every rank goes on
    if rank == 0:
        save(t)   # the file
        dist.barrier(  )  # wait for the save
    if rank == 0:
        dist.all_reduce(t,op=dist.ReduceOp.SUM)  # odd spacing kept
        print(t)
""")
    assert ff.after == """\
import torch.distributed as dist


def main(t, rank):
    # rank 0 saves, then every rank goes on
    if rank == 0:
        save(t)   # the file
    dist.barrier(  )  # wait for the save
    dist.all_reduce(t,op=dist.ReduceOp.SUM)  # odd spacing kept
    if rank == 0:
        print(t)
"""
    assert all(o.made for o in ff.outcomes)


def test_an_arm_left_empty_goes_with_its_if_unless_its_condition_calls_something(tmp_path):
    ff = fixed(tmp_path, """\
import torch.distributed as dist


def main(t, acc):
    if dist.get_rank() == 0:
        dist.broadcast(t, 0)
    if acc.is_main_process:
        acc.wait_for_everyone()
    if not is_main():
        pass
    else:
        dist.barrier()
    if is_main():
        dist.barrier()


def is_main():
    return dist.get_rank() == 0
""")
    assert ff.after == """\
import torch.distributed as dist


def main(t, acc):
    dist.broadcast(t, 0)
    acc.wait_for_everyone()
    dist.barrier()
    if not is_main():
        pass
    dist.barrier()
    if is_main():
        pass


def is_main():
    return dist.get_rank() == 0
"""


@pytest.mark.parametrize("body,why", [
    ("    if rank == 0 and step % 10 == 0:\n        dist.all_reduce(t)\n",
     "also reads step"),
    ("    if rank == 0:\n        t = torch.ones(1)\n        dist.all_reduce(t)\n",
     "reads t, assigned under the condition"),
    ("    if rank == 0:\n        a()\n        dist.all_reduce(t)\n        b()\n",
     "neither the first nor the last"),
    ("    if rank == 0:\n        dist.all_reduce(t)\n    else:\n        dist.broadcast(t, 0)\n",
     "the other arm makes `dist.broadcast`"),
    ("    if rank == 0:\n        x = g(dist.all_reduce(t))\n", "part of a larger statement"),
    ("    if t.sum() > 0:\n        pass\n    elif rank == 0:\n        dist.all_reduce(t)\n",
     "not a plain `if`"),
    ("    for s in range(3):\n        if rank == 0:\n            a()\n            if s == 2:\n"
     "                break\n            dist.barrier()\n", "neither the first nor the last"),
    ("    if rank == 0:\n        if t.sum() > 1:\n            return\n        dist.all_reduce(t)\n",
     "the `if` jumps out"),
])
def test_a_move_that_could_change_what_runs_is_refused_with_why(tmp_path, body, why):
    text = f"import torch\nimport torch.distributed as dist\n\n\ndef main(t, rank):\n{body}"
    ff = fixed(tmp_path, text)
    assert ff.after == text
    said = [o.done for o in ff.outcomes if not o.made]
    assert said and all(s.startswith("not fixed: ") for s in said), said
    assert any(why in s for s in said), said


def test_a_function_of_yours_and_an_early_exit_are_described_not_guessed(tmp_path):
    ff = fixed(tmp_path, """\
import torch.distributed as dist


def save(t):
    dist.all_reduce(t)


def main(t, rank):
    if rank == 0:
        save(t)
    for step in range(3):
        if rank == 1:
            continue
        dist.all_reduce(t)
""")
    assert ff.after == ff.before
    by_code = {o.finding.code: o.done for o in ff.outcomes}
    assert "only you can say whether every rank may call it" in by_code["ND002"]
    assert "Call it on every rank" in by_code["ND002"]  # (the rule's fix, as the description)
    assert "yours to say" in by_code["ND003"] and "Decide the exit" in by_code["ND003"]


def test_generate_gets_synced_gpus_true_and_spread_kwargs_are_left_alone(tmp_path):
    ff = fixed(tmp_path, """\
CONFIG = {"zero_optimization": {"stage": 3}}


def main(engine, prompt, kw):
    a = engine.module.generate(prompt)
    b = engine.module.generate(prompt, synced_gpus=False)
    c = engine.module.generate(
        prompt,
        max_new_tokens=8,  # short
    )
    d = engine.module.generate(prompt, **kw)
    e = engine.module.generate(prompt,
                               max_new_tokens=8)
""")
    assert ff.after == """\
CONFIG = {"zero_optimization": {"stage": 3}}


def main(engine, prompt, kw):
    a = engine.module.generate(prompt, synced_gpus=True)
    b = engine.module.generate(prompt, synced_gpus=True)
    c = engine.module.generate(
        prompt,
        max_new_tokens=8,  # short
        synced_gpus=True,
    )
    d = engine.module.generate(prompt, **kw)
    e = engine.module.generate(prompt,
                               max_new_tokens=8,
                               synced_gpus=True)
"""
    (refused,) = [o for o in ff.outcomes if not o.made]
    assert "spreads **kwargs" in refused.done and refused.finding.line == 11


def test_after_the_fixes_check_finds_none_of_what_was_fixed(tmp_path):
    path = tmp_path / "train.py"
    path.write_text("""\
import torch.distributed as dist


def main(t, rank, engine):
    if rank == 0:
        dist.barrier()
    if rank == 0:
        dist.all_reduce(t)
        print(t)
    engine.generate(t)
    if rank == 1:
        dist.broadcast(t, 1)
    else:
        print("waiting")


ds = {"zero_optimization": {"stage": 3}}
""")
    report = check_paths([path])
    assert [f.code for f in report.findings] == ["ND001", "ND001", "ND005", "ND001"]
    (ff,) = fix_files(report.findings)
    assert all(o.made for o in ff.outcomes), [o.done for o in ff.outcomes]
    ff.write()
    assert check_paths([path]).findings == ()
    compile(path.read_text(), str(path), "exec")


def test_the_file_is_written_whole_with_its_newlines_encoding_and_mode(tmp_path):
    path = tmp_path / "train.py"
    text = ("# -*- coding: latin-1 -*-\r\nimport torch.distributed as dist\r\n\r\n\r\n"
            "def main(t, rank):\r\n    if rank == 0:  # caf\xe9\r\n        dist.barrier()\r\n")
    path.write_bytes(text.encode("latin-1"))
    path.chmod(0o750)
    (ff,) = fix_files(check_paths([path]).findings)
    ff.write()
    data = path.read_bytes()
    assert data.endswith(b"    dist.barrier()\r\n") and b"caf\xe9" in data, data
    assert b"\n" not in data.replace(b"\r\n", b"")
    assert stat.S_IMODE(path.stat().st_mode) == 0o750
    assert [p.name for p in tmp_path.iterdir()] == ["train.py"]  # (no temporary file left)


def test_diff_prints_a_patch_git_applies_and_fix_makes_it(tmp_path):
    path = tmp_path / "train.py"
    text = ("import torch.distributed as dist\n\n\ndef main(t, rank):\n    if rank == 0:\n"
            "        print(t)\n        dist.barrier()\n    for s in range(2):\n"
            "        if rank == 1:\n            continue\n        dist.all_reduce(t)\n")
    path.write_text(text)
    env = dict(os.environ, COLUMNS="")
    diff = subprocess.run([*CLI, "--diff", "train.py"], cwd=tmp_path, capture_output=True,
                          text=True, timeout=60, env=env)
    assert diff.returncode == 1, diff.stderr
    assert path.read_text() == text  # (--diff leaves the file)
    assert diff.stdout.startswith("--- a/train.py\n+++ b/train.py\n"), diff.stdout
    assert "train.py:11:9: ND003 not fixed: " in diff.stderr
    assert "1 of 2 findings with a fix, in 1 file" in diff.stderr, diff.stderr
    subprocess.run(["git", "init", "-q"], cwd=tmp_path, check=True)
    applied = subprocess.run(["git", "apply", "--check", "-"], cwd=tmp_path, input=diff.stdout,
                             capture_output=True, text=True)
    assert applied.returncode == 0, applied.stderr
    fix = subprocess.run([*CLI, "--fix", "train.py"], cwd=tmp_path, capture_output=True,
                         text=True, timeout=60, env=env)
    assert fix.returncode == 1, fix.stderr  # (the early exit is left: a finding remains)
    assert fix.stdout.startswith("train.py:11:9: ND003 "), fix.stdout
    assert "fixed 1 of 2 findings in 1 file; 1 finding in 1 file left" in fix.stderr, fix.stderr
    assert "        print(t)\n    dist.barrier()\n" in path.read_text()
    wrong = subprocess.run([*CLI, "--fix", "--format", "json", "train.py"], cwd=tmp_path,
                           capture_output=True, text=True, timeout=60)
    assert wrong.returncode == 2 and "drop --format" in wrong.stderr, wrong.stderr
    assert "Traceback" not in wrong.stderr


def test_a_synced_gpus_flag_is_left_to_its_author(tmp_path):
    ff = fixed(tmp_path, 'CFG = {"zero_optimization": {"stage": 3}}\n'
                         'p.add_argument("--sync", action="store_true")\n'
                         "args = p.parse_args()\nm.generate(x, synced_gpus=args.sync)\n")
    assert ff.after == ff.before
    (o,) = ff.outcomes
    assert not o.made and "synced_gpus is `args.sync`, yours to decide" in o.done, o.done
