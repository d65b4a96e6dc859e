"""``nccl-doctor check``'s engine (nccl_doctor/check/) on sources written here: a collective on
one side of a rank-dependent condition, through a function of the user's, after a rank-dependent
exit; what splits nobody (both arms, a group's members only, the data, the world size, a
pipeline's send and receive) said nowhere; ignore comments; hostile files one line each."""

from __future__ import annotations

from pathlib import Path

import pytest

from nccl_doctor.check import check_paths


def write(tmp_path: Path, text: str, name: str = "train.py") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def line(path: Path, text: str, after: str | None = None) -> int:
    lines = path.read_text().splitlines()
    start = 0 if after is None else next(i for i, s in enumerate(lines) if after in s) + 1
    return next(n for n, s in enumerate(lines[start:], start + 1) if text in s)


def found(*paths: Path) -> list[tuple[str, int, int]]:
    return [(f.code, f.line, f.condition_line) for f in check_paths(list(paths)).findings]


BUGS = """\
import torch.distributed as dist
from torch.distributed import barrier as sync


def save(model):
    dist.barrier()


class Trainer:
    def sync_metrics(self, t):
        dist.all_reduce(t)

    def step(self, t, rank):
        if rank == 0:
            self.sync_metrics(t)


def main(t, steps):
    rank = dist.get_rank()
    if rank == 0:
        dist.broadcast(t, src=0)
    is_master = rank == 0
    if is_master:
        save(t)
    for step in range(steps):
        if rank == 1 and step == 2:
            continue
        sync()
"""


def test_collectives_some_ranks_may_skip_are_found(tmp_path):
    path = write(tmp_path, BUGS)
    assert found(path) == [
        ("ND002", line(path, "self.sync_metrics(t)"), line(path, "if rank == 0:")),
        ("ND001", line(path, "dist.broadcast(t, src=0)"),
         line(path, "if rank == 0:", "rank = dist.get_rank()")),
        ("ND002", line(path, "save(t)"), line(path, "if is_master:")),
        ("ND003", line(path, "sync()"), line(path, "if rank == 1 and step == 2:")),
    ]
    (f,) = [f for f in check_paths([path]).findings if f.code == "ND003"]
    assert f.call == "sync" and f.names == ("rank",) and f.col == 9
    assert "after the rank-dependent exit at line" in f.message()
    (g,) = [f for f in check_paths([path]).findings if f.call == "save"]
    assert g.via.endswith(f"train.py:{line(path, 'dist.barrier()')} dist.barrier"), g.via


HEALTHY = """\
import torch
import torch.distributed as dist


def main(t, loss, world_size, g02, dp_group, steps):
    rank = dist.get_rank()
    if rank == 0:
        dist.broadcast(t, src=0)
    else:
        dist.broadcast(t, src=0)
    if rank in (0, 2):
        dist.all_reduce(t, group=g02)
    if dp_group is not None:
        dist.all_reduce(t, group=dp_group)
    if world_size > 1:
        dist.all_reduce(t)
    if rank == 0:
        print("only logs")
        torch.save(t, "x.pt")
    if rank == 0:
        dist.send(t, dst=1)
    else:
        dist.recv(t, src=0)
    for step in range(steps):
        if not torch.isfinite(loss):
            continue
        dist.all_reduce(t)
    dist.broadcast_object_list([t if rank == 0 else None], src=0)
"""


def test_what_splits_nobody_is_said_nowhere(tmp_path):
    assert found(write(tmp_path, HEALTHY)) == []


# torch.distributed's own idioms (its optimizer, FSDP, DTensor and sharded-tensor code): a way
# out for the ranks outside the group the collective is on, a test of whether a rank is set at
# all, a chosen rank or a mode every rank is given, an assert written out, ways out written on
# both sides of the rank's test.
IDIOMS = """\
import torch.distributed as dist
from torch.distributed import distributed_c10d as c10d


def mesh_broadcast(t, mesh):
    dist.broadcast(t, src=0)


def average(params, group, src_rank, rank0_only):
    if c10d._rank_not_in_group(group):
        return
    if src_rank is None:
        return params
    dist.all_reduce(params, group=group)
    if rank0_only:
        dist.broadcast(params, src=0, group=group)


def gather(out, dst, mesh, x):
    rank = dist.get_rank()
    if rank == dst:
        if out is None:
            raise AssertionError
    if not mesh._is_current_rank_part_of_mesh():
        return None
    dist.gather(x, dst=dst, group=mesh.get_group())
    mesh_broadcast(x, mesh)


def state(value, group):
    if dist.get_rank(group) == 0:
        if value is None:
            return value
    else:
        if value is not None:
            return value
    dist.broadcast(value, src=0, group=group)


def setup(tokens_per_rank, n, group):
    if not (dist.is_initialized() and dist.get_rank() > -1):
        raise RuntimeError("not distributed")
    if tokens_per_rank < n:
        dist.barrier()
    if dist.get_rank(group) < 0:
        return
    dist.all_reduce(n, group=group)
"""

# ... and their twins that do split the ranks.
IDIOMS_BROKEN = """\
import torch.distributed as dist
from torch.distributed import distributed_c10d as c10d


def average(params, group):
    if c10d._rank_not_in_group(group):
        return
    dist.all_reduce(params)


def check(x):
    rank = dist.get_rank()
    if rank == 0:
        if x is None:
            raise ValueError("no x on rank 0")
    dist.barrier()


def chosen(x):
    src_rank = dist.get_rank()
    if src_rank == 0:
        dist.broadcast(x, src=0)


def late(x):
    if dist.get_rank() > 0:
        dist.barrier()


def mixed(x, g):
    rank = dist.get_rank()
    if dist.get_rank(g) < 0 or rank == 1:
        return
    dist.barrier(group=g)
"""


def test_torchs_own_idioms_split_nobody_and_their_broken_twins_are_found(tmp_path):
    assert found(write(tmp_path, IDIOMS)) == []
    path = write(tmp_path, IDIOMS_BROKEN, "broken.py")
    assert found(path) == [
        ("ND003", line(path, "dist.all_reduce(params)"), line(path, "_rank_not_in_group")),
        ("ND003", line(path, "dist.barrier()"), line(path, "if rank == 0:")),
        ("ND001", line(path, "dist.broadcast(x, src=0)"), line(path, "if src_rank == 0:")),
        ("ND001", line(path, "dist.barrier()", "def late"), line(path, "get_rank() > 0")),
        ("ND003", line(path, "dist.barrier(group=g)"), line(path, "get_rank(g) < 0 or rank")),
    ]


def test_an_ignore_comment_on_the_call_or_the_condition_silences_its_rule(tmp_path):
    path = write(tmp_path, """\
import torch.distributed as dist


def main(t, rank):
    if rank == 0:
        dist.barrier()  # nccl-doctor: ignore[ND001]
    if rank == 1:  # nccl-doctor: ignore
        dist.barrier()
    if rank == 2:
        dist.barrier()  # nccl-doctor: ignore[ND003]
""")
    assert found(path) == [("ND001", line(path, "ignore[ND003]"), line(path, "if rank == 2:"))]


def test_a_function_imported_from_another_file_checked_is_followed_by_name(tmp_path):
    write(tmp_path, "import torch.distributed as dist\n\n\ndef gather_all(t):\n"
                    "    dist.all_gather_into_tensor(t, t)\n", "helpers.py")
    main = write(tmp_path, "from helpers import gather_all\n\n\ndef main(t, rank):\n"
                           "    if rank == 0:\n        gather_all(t)\n\n\ndef evaluate(t):\n"
                           "    return t\n")
    other = write(tmp_path, "def run(t, rank):\n    if rank == 0:\n        evaluate(t)\n",
                  "other.py")
    # (other.py's evaluate is not main.py's: a bare name is followed in its own file only)
    assert found(tmp_path) == [("ND002", 6, 5)]
    assert found(main) == [] and found(other) == []  # (helpers.py not checked: not followed)


@pytest.mark.parametrize("data,why", [
    (b"def broken(:\n", "not Python this interpreter parses (SyntaxError at line 1)"),
    (b"# -*- coding: no-such-codec -*-\nx = 1\n", "cannot be decoded"),
    (b"x = '\xff\xfe'\n", "cannot be decoded"),
])
def test_a_file_that_cannot_be_read_is_one_line(tmp_path, data, why):
    bad = tmp_path / "bad.py"
    bad.write_bytes(data)
    good = write(tmp_path, BUGS)
    report = check_paths([bad, good])
    (problem,) = report.problems
    assert problem.startswith(f"{bad}: {why}"), problem
    assert report.files == 1 and report.findings  # the others are still read


def test_one_rank_first_with_the_negated_condition_pairs_and_is_not_said(tmp_path):
    """``if not is_main: barrier()``, the main process's work, ``if is_main: barrier()``: every
    rank makes one barrier (transformers' main_process_first). Two different ranks' barriers
    at two places pair nobody else's: said."""
    path = write(tmp_path, """\
import contextlib

import torch.distributed as dist


@contextlib.contextmanager
def main_first(is_main):
    if not is_main:
        dist.barrier()
    yield
    if is_main:
        dist.barrier()


def wrong(rank):
    if rank == 0:
        dist.barrier()
    if rank == 1:
        dist.barrier()
""")
    assert [(c, cl) for c, _, cl in found(path)] == [
        ("ND001", line(path, "if rank == 0:")), ("ND001", line(path, "if rank == 1:"))]


def test_the_parsers_formats_are_the_renderers():
    from nccl_doctor.check import FORMATS, formats

    assert FORMATS == formats.FORMATS


def test_a_rank_derived_argument_is_followed_from_its_caller(tmp_path):
    """``share(t, dist.get_rank() == 0)``: in share, ``if flag:`` is the rank's (the run's own
    reading of a caller's argument); a flag that only decides a print is not said."""
    path = write(tmp_path, """\
import torch.distributed as dist


def share(t, flag):
    if flag:
        dist.all_reduce(t)


def logged(t, flag):
    if flag:
        print("main")
    dist.all_reduce(t)


def main(t):
    share(t, dist.get_rank() == 0)
    logged(t, dist.get_rank() == 0)
""")
    (f,) = check_paths([path]).findings
    assert (f.code, f.line, f.condition_line) == ("ND001", 6, 5)
    assert f.how.startswith("`flag` is `dist.get_rank() == 0`, passed at"), f.how


def test_the_projects_settings_switch_rules_off_and_leave_files_out(tmp_path):
    from nccl_doctor.check import settings
    from nccl_doctor.errors import UsageError

    (tmp_path / "scripts").mkdir()
    (tmp_path / "legacy").mkdir()
    write(tmp_path, BUGS, "scripts/tool.py")
    write(tmp_path, BUGS, "legacy/old.py")
    write(tmp_path, BUGS, "train.py")
    (tmp_path / "pyproject.toml").write_text(
        '[tool.nccl-doctor.check]\nignore = ["ND003"]\n'
        'per-file-ignores = {"scripts/*" = ["ND001", "ND002"]}\nexclude = ["legacy/"]\n')
    found_ = settings.find(tmp_path / "scripts")  # (from a folder below it)
    report = check_paths([tmp_path], found_)
    where = sorted({(Path(f.path).relative_to(tmp_path).as_posix(), f.code)
                    for f in report.findings})
    assert where == [("train.py", "ND001"), ("train.py", "ND002")], where
    assert report.files == 2  # legacy/ not read
    for bad, said in [('ignore = ["ND999"]', "no rule ND999"), ("ignore = 3", "must be a list"),
                      ("colour = 1", "has no setting 'colour'")]:
        (tmp_path / "pyproject.toml").write_text(f"[tool.nccl-doctor.check]\n{bad}\n")
        with pytest.raises(UsageError, match=said):
            settings.find(tmp_path)
    (tmp_path / "pyproject.toml").write_text("[tool.other]\nx = 1\n")
    assert settings.find(tmp_path).source == ""


def test_a_library_call_that_makes_collectives_is_found_by_the_catalog(tmp_path):
    """ND004: the run's catalog of library calls every rank must make, matched at a call site
    by the method's name where it says it, by a receiver named for its class, or by the module
    a name was imported from; only for a package installed in the entry's range."""
    path = write(tmp_path, """\
import torch.distributed as dist
import torch.distributed.checkpoint as dcp


def main(accelerator, trainer, model, state):
    if accelerator.is_main_process:
        accelerator.wait_for_everyone()
    if trainer.is_world_process_zero():
        trainer.evaluate()
    if dist.get_rank() == 0:
        dcp.save(state, checkpoint_id="ckpt")
        model.evaluate()
    accelerator.wait_for_everyone()
""")
    found_ = check_paths([path]).findings
    assert [(f.code, f.line, f.condition_line) for f in found_] == [
        ("ND004", 7, 6), ("ND004", 9, 8), ("ND004", 11, 10)]
    wait = found_[0]
    assert wait.via.startswith("accelerate: it is a barrier"), wait.via
    assert "wait_for_everyone() on every rank" in wait.to_json()["fix"]
    assert found_[2].via.startswith("torch: "), found_[2].via


@pytest.mark.parametrize("shown", [
    'CONFIG = {"zero_optimization": {"stage": 3}}',
    "model = fully_shard(model)",
    "trainer = make(zero_stage=3)",
])
def test_generate_under_zero3_or_fsdp_without_synced_gpus_is_found(tmp_path, shown):
    path = write(tmp_path, f"""\
{shown}


def main(engine, prompt, flag):
    engine.module.generate(prompt)
    engine.module.generate(prompt, synced_gpus=False)
    engine.module.generate(prompt, synced_gpus=True)
    engine.module.generate(prompt, synced_gpus=flag)
""")
    assert [(c, ln) for c, ln, _ in found(path)] == [("ND005", 5), ("ND005", 6)]


def test_generate_with_no_sharding_in_sight_is_not_said(tmp_path):
    path = write(tmp_path, 'CONFIG = {"zero_optimization": {"stage": 2}}\n\n\n'
                           "def main(model, prompt):\n    model.generate(prompt)\n")
    assert found(path) == []


def test_groups_created_in_a_rank_dependent_order_are_found_the_same_order_is_not(tmp_path):
    path = write(tmp_path, """\
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh


def main(rank, world):
    if rank < 2:
        low = dist.new_group([0, 1])
        high = dist.new_group([2, 3])
    else:
        high = dist.new_group([2, 3])
        low = dist.new_group([0, 1])
    if rank < 2:
        a = dist.new_group([0, 1])
        b = dist.new_group([2, 3])
    else:
        a = dist.new_group([0, 1])
        b = dist.new_group([2, 3])
    if rank in (0, 1):
        local = dist.new_group([0, 1], use_local_synchronization=True)
    if rank != 1:
        mesh = init_device_mesh("cpu", (2, world // 2))
""")
    report = check_paths([path])
    assert [(f.code, f.line, f.condition_line) for f in report.findings] == [
        ("ND006", line(path, "low = dist"), line(path, "if rank < 2:")),
        ("ND001", line(path, "init_device_mesh(\"cpu\""), line(path, "if rank != 1:"))]
    order = report.findings[0]
    assert order.call == ("new_group([0, 1]) then new_group([2, 3]) vs new_group([2, 3]) then "
                          "new_group([0, 1])"), order.call
    assert "rank-dependent order" in order.message() and "same order" in order.rule.fix


def test_the_same_condition_in_the_other_arm_is_not_the_one_rank_first_idiom(tmp_path):
    path = write(tmp_path, """\
import torch.distributed as dist


def main():
    is_main = dist.get_rank() == 0
    if not is_main:
        pass
    else:
        dist.barrier()
    if is_main:
        dist.barrier()
""")
    assert [c for c, _, _ in found(path)] == ["ND001", "ND001"]


def test_the_console_is_one_line_a_finding_in_a_pipe_and_fits_a_terminal(tmp_path, monkeypatch):
    from nccl_doctor.check import formats

    path = write(tmp_path, BUGS)
    monkeypatch.chdir(tmp_path)  # (paths said from here: train.py)
    report = check_paths([path])
    piped = formats.console(report).splitlines()
    assert len(piped) == len(report.findings)
    assert all(s.startswith("train.py:") for s in piped), piped
    for width in (60, 100):
        lines = formats.console(report, width).splitlines()
        assert lines and all(len(s) <= width for s in lines), [s for s in lines if len(s) > width]
        heads = [s for s in lines if not s.startswith(formats.INDENT)]
        assert len(heads) == len(report.findings), heads
        assert sum("fix: " in s for s in lines) == len(report.findings)


def test_a_synced_gpus_flag_off_unless_given_is_said_with_the_flag():
    """tests/frameworks/jobs/ds_generate.py, the job whose hang the frameworks tier diagnoses:
    ``synced_gpus=args.fixed``, ``--fixed`` a store_true flag."""
    job = Path(__file__).resolve().parents[1] / "frameworks" / "jobs" / "ds_generate.py"
    (f,) = check_paths([job]).findings
    assert (f.code, f.line) == ("ND005", line(job, "out = engine.module.generate"))
    flag = line(job, 'add_argument("--fixed"')
    assert f"synced_gpus=args.fixed is False unless --fixed is given (line {flag})" \
        in f.message(), f.message()


@pytest.mark.parametrize("flag,said", [
    ('p.add_argument("--sync", action="store_true")', True),
    ('p.add_argument("--sync", default=False, type=bool)', True),
    ('p.add_argument("--sync", action="store_true", default=True)', False),
    ('p.add_argument("--no-sync", dest="sync", action="store_false")', False),
])
def test_a_flag_is_said_only_where_it_is_off_by_default(tmp_path, flag, said):
    path = write(tmp_path, f'CFG = {{"zero_optimization": {{"stage": 3}}}}\n{flag}\n'
                           "args = p.parse_args()\nm.generate(x, synced_gpus=args.sync)\n")
    assert bool(found(path)) is said


def test_the_sharding_is_seen_in_a_linked_module_a_named_config_or_the_command(tmp_path):
    from nccl_doctor.check.command import configs_of_command

    write(tmp_path, "from config import CFG\n\n\ndef main(model, p):\n    model.generate(p)\n")
    write(tmp_path, "CFG = dict(zero_stage=3)\n", "config.py")
    write(tmp_path, "def main(model, p):\n    model.generate(p)\n", "alone.py")
    write(tmp_path, 'ARGS = dict(deepspeed="ds_z3.json")\n\n\ndef main(m, p):\n'
                    "    m.generate(p)\n", "named.py")
    write(tmp_path, '{"zero_optimization": {"stage": 3, "overlap_comm": true}}', "ds_z3.json")
    write(tmp_path, "distributed_type: FSDP\nfsdp_config:\n  fsdp_version: 2\n", "fsdp.yaml")
    write(tmp_path, '{"zero_optimization": {"stage": 2}}', "ds_z2.json")
    report = check_paths([tmp_path])
    said = {Path(f.path).name: f for f in report.findings}
    assert sorted(said) == ["named.py", "train.py"], said
    assert "shown in config.py:1" in said["train.py"].message()
    assert "(shown in ds_z3.json)" in said["named.py"].message()
    for config, what in (("fsdp.yaml", "FSDP"), ("ds_z3.json", "ZeRO-3"), ("ds_z2.json", None)):
        configs = configs_of_command(["accelerate", "launch", f"--config_file={config}",
                                      "alone.py"], tmp_path)
        got = [f for f in check_paths([tmp_path / "alone.py"], configs=configs).findings]
        assert [f.condition for f in got] == ([what] if what else []), (config, got)


def test_the_catalog_is_matched_by_the_versions_given_else_those_installed(tmp_path):
    """A run points back with the libraries its ranks recorded (their environment, not the
    supervisor's): Lightning is not installed here, its entries apply when its version is
    given."""
    path = write(tmp_path, """\
import lightning as L


class Module(L.LightningModule):
    def on_train_batch_end(self, outputs, batch, batch_idx):
        if self.global_rank == 0:
            self.log("loss", outputs["loss"], sync_dist=True)
            self.log("lr", 0.1)
""")
    from importlib.util import find_spec

    assert find_spec("lightning") is None, "the case needs Lightning absent here"
    assert check_paths([path]).findings == ()
    (f,) = check_paths([path], versions={"lightning": "2.6.6"}).findings
    assert (f.code, f.line, f.call) == ("ND004", line(path, 'self.log("loss"'), "self.log")
    assert "sync_dist" in f.fix or "every rank" in f.fix, f.fix


def test_a_loop_whose_count_depends_on_the_rank_is_found_one_on_the_world_is_not(tmp_path):
    path = write(tmp_path, """\
import torch.distributed as dist


def main(t, shards):
    rank = dist.get_rank()
    for _ in range(rank + 1):
        dist.all_reduce(t)
    for _ in range(dist.get_world_size()):
        dist.all_reduce(t)
    for shard in shards:
        dist.all_reduce(shard)
""")
    report = check_paths([path])
    (f,) = report.findings
    assert (f.code, f.line, f.condition_line, f.arm) == (
        "ND003", line(path, "dist.all_reduce(t)"), line(path, "range(rank + 1)"), "for")
    assert "in the loop whose count depends on the rank" in f.message(), f.message()
