"""The branch on the rank that split the ranks, found in source (source/branch.py) and the
source files it reads (source/source_text.py). Every source is written to tmp_path; the frames
point at lines marked ``# HERE`` (or ``# HERE2``)."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from nccl_doctor.source.branch import Branch, branches, loops, rank_like
from nccl_doctor.source.source_text import Sources, digest
from nccl_doctor.location import Location


def write(tmp_path: Path, source: str, name: str = "train.py") -> str:
    path = tmp_path / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(textwrap.dedent(source))
    return str(path)


def at(path: str, function: str, marker: str = "# HERE") -> Location:
    lines = Path(path).read_text().split("\n")
    hits = [n for n, text in enumerate(lines, 1) if text.rstrip().endswith(marker)]
    assert len(hits) == 1, f"{marker} marks {len(hits)} lines"
    return Location(path, hits[0], function)


def line_of(path: str, fragment: str) -> int:
    lines = Path(path).read_text().split("\n")
    return next(n for n, text in enumerate(lines, 1) if fragment in text)


def find(*frames: Location, sources: Sources | None = None) -> tuple[Branch, ...]:
    found, skipped = branches(frames, sources or Sources(verify=False))
    assert skipped == ()
    return found


def kinds(found: tuple[Branch, ...]) -> list[tuple[str, int]]:
    return [(b.kind, b.line) for b in found]


# -- the conditions ----------------------------------------------------------------------------

def test_if_rank_zero(tmp_path: Path) -> None:
    path = write(tmp_path, """\
        import torch.distributed as dist
        def main(rank):
            if rank == 0:
                dist.barrier()  # HERE
            dist.all_reduce(x)
        """)
    frame = at(path, "main")
    (branch,) = find(frame)
    assert (branch.kind, branch.line, branch.text) == ("if", 3, "if rank == 0:")
    assert branch.names == ("rank",)
    assert branch.skips is False
    assert branch.frame is frame and branch.function == "main" and branch.path == path


def test_else_branch_names_the_if_header(tmp_path: Path) -> None:
    path = write(tmp_path, """\
        def main(rank):
            if rank == 0:
                save()
            else:
                dist.all_reduce(x)  # HERE
        """)
    (branch,) = find(at(path, "main"))
    assert (branch.kind, branch.line, branch.text) == ("else", 2, "if rank == 0:")


def test_elif_names_its_own_header_and_the_if_it_is_the_else_of(tmp_path: Path) -> None:
    path = write(tmp_path, """\
        def main(local_rank, step):
            if local_rank == 0:
                save()
            elif local_rank == 1:
                dist.barrier()  # HERE
            elif step > 3:
                dist.all_reduce(x)  # HERE2
        """)
    assert kinds(find(at(path, "main"))) == [("if", 4), ("else", 2)]
    found = find(at(path, "main", "# HERE2"))
    assert kinds(found) == [("else", 4), ("else", 2)]  # the elif on step does not count
    assert found[0].text == "elif local_rank == 1:"


def test_and_with_trainer_is_global_zero(tmp_path: Path) -> None:
    path = write(tmp_path, """\
        class Model:
            def on_validation_batch_end(self, trainer, batch_idx):
                if batch_idx == 3 and trainer.is_global_zero:
                    trainer.strategy.barrier()  # HERE
        """)
    (branch,) = find(at(path, "Model.on_validation_batch_end"))
    assert branch.kind == "if" and branch.names == ("trainer.is_global_zero",)
    assert branch.function == "Model.on_validation_batch_end"


@pytest.mark.parametrize("test, names", [
    ("accelerator.is_main_process", ("accelerator.is_main_process",)),
    ("self.state.is_world_process_zero", ("self.state.is_world_process_zero",)),
    ('int(os.environ["RANK"]) == 0', ('os.environ["RANK"]',)),
    ('os.environ.get("LOCAL_RANK", "0") == "0"', ('os.environ.get("LOCAL_RANK", "0")',)),
    ('os.getenv("SLURM_PROCID") == "0"', ('os.getenv("SLURM_PROCID")',)),
    ("dist.get_rank() == 1", ("dist.get_rank()",)),
    ("torch.distributed.get_rank(group) != 0", ("torch.distributed.get_rank(group)",)),
    ("is_main_process()", ("is_main_process()",)),
    ("self.args.process_index == 0", ("self.args.process_index",)),
    ("group.rank() == 0", ("group.rank()",)),
    ("ddp_rank == 0 or tp_rank == 1", ("ddp_rank", "tp_rank")),
])
def test_rank_tests(tmp_path: Path, test: str, names: tuple[str, ...]) -> None:
    path = write(tmp_path, f"""\
        import os
        def step(self, accelerator, group, ddp_rank, tp_rank):
            if {test}:
                dist.barrier()  # HERE
        """)
    (branch,) = find(at(path, "step"))
    assert branch.kind == "if" and branch.names == names


@pytest.mark.parametrize("test", [
    "step % 10 == 0", "world_size > 1", "len(ranks) == 2", '"RANK" in os.environ',
    'os.environ["WORLD_SIZE"] == "2"', "self.args.frank",
])
def test_conditions_not_on_the_rank_find_nothing(tmp_path: Path, test: str) -> None:
    path = write(tmp_path, f"""\
        import os
        def step(self, step, world_size, ranks):
            if {test}:
                dist.all_reduce(x)  # HERE
        """)
    assert find(at(path, "step")) == ()


def test_rank_like_names() -> None:
    for name in ("rank", "RANK", "local_rank", "ddp_rank", "tp_rank", "rank_id", "globalRank",
                 "is_rank0", "rank_zero_only", "is_rankzero", "is_global_zero",
                 "LOCAL_PROCESS_INDEX"):
        assert rank_like(name), name
    for name in ("ranks", "world_size", "frank", "ranking", "num_ranks", "cranky", "zero"):
        assert not rank_like(name), name
    # a chosen rank, or a mode every rank is given alike - unless it tests this rank
    for name in ("src_rank", "dst_rank", "group_src_rank", "rank0_only", "tokens_per_rank",
                 "root_rank", "target_rank", "src_data_rank"):
        assert not rank_like(name), name
    for name in ("is_src_rank", "current_rank", "my_root_rank", "local_rank"):
        assert rank_like(name), name


def test_data_flow_from_rank_to_a_local_name(tmp_path: Path) -> None:
    path = write(tmp_path, """\
        def main():
            ddp_rank = int(os.environ["RANK"])
            master_process = ddp_rank == 0  # nanoGPT
            flag: bool = master_process
            also = (copy := flag)
            other, is_master = 5, also
            if is_master:
                dist.barrier()  # HERE
            if other:
                dist.all_reduce(x)  # HERE2
        """)
    (branch,) = find(at(path, "main"))
    assert branch.kind == "if" and branch.names == ("is_master",)
    assert find(at(path, "main", "# HERE2")) == ()  # the tuple's other element is not the rank's


def test_data_flow_only_through_values_computed_from_the_rank(tmp_path: Path) -> None:
    path = write(tmp_path, """\
        def setup(args, model, local_rank):
            device = torch.device("cuda", local_rank)
            model = model.to(local_rank)
            rng_file = f"rng_state_{local_rank}.pth"
            if device is None or model is None or os.path.isfile(rng_file):
                dist.barrier()  # HERE
            first = max(0, int(getattr(args, "local_rank", -1))) == 0
            if first:
                dist.barrier()  # HERE2
        """)
    assert find(at(path, "setup")) == ()  # the same answer on every rank
    (branch,) = find(at(path, "setup", "# HERE2"))
    assert branch.names == ("first",)


def test_data_flow_through_augmented_and_attribute_assignment(tmp_path: Path) -> None:
    path = write(tmp_path, """\
        class T:
            def run(self, rank):
                offset = 0
                offset += rank
                self.is_first = offset == 0
                if self.is_first:
                    dist.barrier()  # HERE
        """)
    (branch,) = find(at(path, "T.run"))
    assert branch.names == ("self.is_first",)


def test_module_level_name_assigned_from_the_rank(tmp_path: Path) -> None:
    path = write(tmp_path, """\
        import os
        RANK_ENV = int(os.environ.get("RANK", "0"))
        IS_MASTER = (
            RANK_ENV == 0
        )
        DEBUG = False

        def main():
            if IS_MASTER:
                dist.barrier()  # HERE
            if DEBUG:
                dist.all_reduce(x)  # HERE2
        """)
    (branch,) = find(at(path, "main"))
    assert branch.names == ("IS_MASTER",)
    assert find(at(path, "main", "# HERE2")) == ()


def test_module_level_frame(tmp_path: Path) -> None:
    path = write(tmp_path, """\
        import os
        rank = int(os.environ["RANK"])
        leader = rank == 0
        for step in range(3):
            if leader:
                dist.barrier()  # HERE
        """)
    (branch,) = find(at(path, "<module>"))
    assert (branch.kind, branch.names, branch.function) == ("if", ("leader",), "<module>")


def test_while_on_the_rank(tmp_path: Path) -> None:
    path = write(tmp_path, """\
        def main(rank):
            while rank < 2:
                dist.barrier()  # HERE
                rank += 2
        """)
    (branch,) = find(at(path, "main"))
    assert (branch.kind, branch.line) == ("while", 2)


def test_conditional_expression(tmp_path: Path) -> None:
    path = write(tmp_path, """\
        def main(rank, x):
            y = (
                dist.all_reduce(x)  # HERE
                if rank == 0
                else None
            )
            z = dist.get_rank() + dist.all_reduce(x)  # HERE2
        """)
    (branch,) = find(at(path, "main"))
    assert (branch.kind, branch.line, branch.text) == ("ifexp", 4, "if rank == 0")
    assert find(at(path, "main", "# HERE2")) == ()


def test_match_on_the_rank(tmp_path: Path) -> None:
    path = write(tmp_path, """\
        def main(rank, mode):
            match rank:
                case 0:
                    dist.barrier()  # HERE
                case _:
                    pass
            match mode:
                case "a" if dist.get_rank() == 1:
                    dist.all_reduce(x)  # HERE2
                case "b":
                    dist.broadcast(x, 0)  # HERE3
        """)
    (branch,) = find(at(path, "main"))
    assert (branch.kind, branch.line, branch.names) == ("match", 2, ("rank",))
    (guard,) = find(at(path, "main", "# HERE2"))
    assert (guard.kind, guard.line, guard.names) == ("match", 8, ("dist.get_rank()",))
    assert find(at(path, "main", "# HERE3")) == ()


def test_decorator_rank_zero_only(tmp_path: Path) -> None:
    path = write(tmp_path, """\
        from lightning.pytorch.utilities import rank_zero_only

        @rank_zero_only
        def log_once(x):
            dist.barrier()  # HERE

        @torch.no_grad()
        def plain(x):
            dist.barrier()  # HERE2
        """)
    (branch,) = find(at(path, "log_once"))
    assert (branch.kind, branch.line, branch.text) == ("decorator", 3, "@rank_zero_only")
    assert branch.names == ("rank_zero_only",)
    assert find(at(path, "plain", "# HERE2")) == ()


def test_lambda(tmp_path: Path) -> None:
    path = write(tmp_path, """\
        def main(rank):
            hooks = [lambda: dist.barrier() if rank == 0 else None]  # HERE
            def cb(): return dist.barrier() if rank == 0 else None  # HERE2
            for hook in hooks:
                hook()
        """)
    found = find(at(path, "main.<locals>.<lambda>"))
    assert kinds(found) == [("ifexp", 2)]
    assert found[0].function == "main.<locals>.<lambda>"
    assert kinds(find(at(path, "main.<locals>.cb", "# HERE2"))) == [("ifexp", 3)]
    # main's own frame on those lines makes the lambda and the function: their tests are not its
    assert find(at(path, "main")) == ()
    assert find(at(path, "main", "# HERE2")) == ()


def test_comprehension_filter(tmp_path: Path) -> None:
    path = write(tmp_path, """\
        def main(xs, step):
            works = [dist.all_reduce(x, async_op=True) for x in xs if dist.get_rank() == 0]  # HERE
            other = [dist.all_reduce(x) for x in xs if step > 1]  # HERE2
        """)
    inner = at(path, "main.<locals>.<listcomp>")
    found = find(inner, at(path, "main"))  # 3.11: the comprehension is a frame of its own
    assert kinds(found) == [("comprehension", 2)]  # once, with the innermost frame
    assert found[0].frame is inner and found[0].names == ("dist.get_rank()",)
    assert find(at(path, "main.<locals>.<listcomp>", "# HERE2")) == ()


def test_nested_function_keeps_its_conditions(tmp_path: Path) -> None:
    path = write(tmp_path, """\
        def outer(rank, step):
            def inner():
                if rank == 0:
                    dist.barrier()
                return 1
            if step > 2:
                inner()  # HERE
            is_first = rank == 0
            def other():
                if is_first:
                    dist.barrier()  # HERE2
            other()
        """)
    assert find(at(path, "outer")) == ()  # inner's `if rank == 0` is inner's frame's
    (branch,) = find(at(path, "outer.<locals>.other", "# HERE2"))
    assert branch.names == ("is_first",)  # a closure's name derived in the outer function


# -- jumps before the call ---------------------------------------------------------------------

def test_continue_on_the_rank_earlier_in_the_loop(tmp_path: Path) -> None:
    path = write(tmp_path, """\
        def main(rank, loader):
            for step, batch in enumerate(loader):
                if rank != 0 and step % 2:
                    continue
                for x in batch:
                    if rank == 1:
                        break
                with ctx():
                    if rank == 2:
                        continue
                dist.all_reduce(batch)  # HERE
        """)
    found = find(at(path, "main"))
    assert kinds(found) == [("jump", 9), ("jump", 3)]  # nearest first; not the inner loop's
    assert all(b.skips for b in found)
    assert found[1].text == "if rank != 0 and step % 2:" and found[1].names == ("rank",)


def test_a_break_in_an_inner_loop_does_not_count(tmp_path: Path) -> None:
    path = write(tmp_path, """\
        def main(rank, batches):
            for batch in batches:
                for x in batch:
                    if rank == 0:
                        break
                    else:
                        continue
                dist.all_reduce(batch)  # HERE
            for again in batches:
                if rank == 0:
                    break
            dist.barrier()  # HERE2
        """)
    assert find(at(path, "main")) == ()
    assert find(at(path, "main", "# HERE2")) == ()  # that loop does not hold the call


def test_early_return_and_raise_on_the_rank(tmp_path: Path) -> None:
    path = write(tmp_path, """\
        def save(rank, step):
            if step:
                pass
            if rank != 0:
                log()
                return
            if step > 10:
                pass
            elif dist.get_rank() == 3:
                raise RuntimeError("no")
            def helper():
                if rank == 1:
                    return
            dist.barrier()  # HERE
        """)
    found = find(at(path, "save"))
    assert kinds(found) == [("jump", 9), ("jump", 4)]  # helper's return is not save's
    assert found[0].text == "elif dist.get_rank() == 3:"
    assert found[0].names == ("dist.get_rank()",)


def test_jump_in_the_else_of_a_rank_test(tmp_path: Path) -> None:
    path = write(tmp_path, """\
        def main(rank):
            if rank == 0:
                prepare()
            else:
                return None
            dist.barrier()  # HERE
        """)
    (branch,) = find(at(path, "main"))
    assert (branch.kind, branch.line, branch.skips) == ("jump", 2, True)


def test_a_return_after_the_call_does_not_count(tmp_path: Path) -> None:
    path = write(tmp_path, """\
        def main(rank):
            dist.barrier()  # HERE
            if rank == 0:
                return
        """)
    assert find(at(path, "main")) == ()


# -- several frames, several files -------------------------------------------------------------

def test_branch_in_a_helper_module(tmp_path: Path) -> None:
    helper = write(tmp_path, """\
        def sync(x, rank):
            if rank == 0:
                return dist.all_reduce(x)  # HERE
            return x
        """, name="helper.py")
    main = write(tmp_path, """\
        from helper import sync
        def main(args):
            is_master = args.rank == 0
            if is_master:
                sync(x, args.rank)  # HERE
        """)
    found = find(at(helper, "sync"), at(main, "main"))
    assert [(b.path, b.kind, b.line) for b in found] == [(helper, "if", 2), (main, "if", 4)]
    assert found[1].names == ("is_master",)


def test_loops(tmp_path: Path) -> None:
    path = write(tmp_path, """\
        def main(loader):
            for epoch in range(3):
                while True:
                    dist.all_reduce(x)  # HERE
                    break
                else:
                    dist.barrier()  # HERE2
            dist.broadcast(x, 0)  # HERE3

        def outer():
            for batch in loader:
                main(batch)  # HERE4
                after()
        """)
    (loop,) = loops([at(path, "main")], Sources(verify=False))
    assert (loop.line, loop.text, loop.first_line, loop.last_line) == (3, "while True:", 3, 5)
    (loop,) = loops([at(path, "main", "# HERE2")], Sources(verify=False))
    assert (loop.line, loop.first_line, loop.last_line) == (2, 2, 7)  # not the while's else
    assert loops([at(path, "main", "# HERE3")], Sources(verify=False)) == ()
    found = loops([at(path, "main"), at(path, "outer", "# HERE4")], Sources(verify=False))
    assert [(lp.line, lp.function, lp.last_line) for lp in found] == [
        (3, "main", 5), (11, "outer", 13)]


def test_loop_of_a_frame_on_the_for_header(tmp_path: Path) -> None:
    path = write(tmp_path, """\
        def main(loader):
            for batch in loader:  # HERE
                step(batch)
        """)
    (loop,) = loops([at(path, "main")], Sources(verify=False))
    assert (loop.line, loop.first_line, loop.last_line) == (2, 2, 3)


# -- finding the function in a big file --------------------------------------------------------

BIG_CLASS = '''\
class Trainer:
    """A docstring."""

    def first(self):
        return 1

    @decorate(
        option=True,
    )
    def evaluation_loop(
        self,
        rank,
    ):
        text = """
not indented: a string's lines at column 0
def evaluation_loop():
"""
        if self.args.local_rank == 0:
            dist.barrier()  # HERE
        return text

    def last(self):
        return 2
'''


def test_method_of_a_big_class_with_odd_lines(tmp_path: Path) -> None:
    filler = "".join(f"    def f{i}(self):\n        return {i}\n\n" for i in range(300))
    path = write(tmp_path, BIG_CLASS.replace("    def first", filler + "    def first"))
    (branch,) = find(at(path, "Trainer.evaluation_loop"))
    assert branch.names == ("self.args.local_rank",)
    assert branch.line == line_of(path, "if self.args.local_rank == 0:")


def test_the_region_parsed_is_the_function_not_the_file(tmp_path: Path) -> None:
    filler = "".join(f"def f{i}():\n    return {i}\n\n" for i in range(200))
    path = write(tmp_path, filler + "def main(rank):\n    if rank:\n        go()  # HERE\n"
                 + filler.replace("def f", "def g") + "syntax error here (\n")
    sources = Sources(verify=False)
    (branch,) = find(at(path, "main"), sources=sources)
    assert branch.kind == "if"  # the file's syntax error is in text never parsed
    region = sources.region(path, branch.frame.line, "main")
    assert not isinstance(region, str) and region.whole_file is False


def test_multi_line_decorator_and_signature_parsed_alone(tmp_path: Path) -> None:
    filler = "".join(f"    def f{i}(self):\n        return {i}\n\n" for i in range(50))
    path = write(tmp_path, "class Module:\n" + filler + textwrap.indent(textwrap.dedent("""\
            @on_rank(
                0,
            )
            def hook(
                self,
                x,
            ):
                dist.barrier()  # HERE

            def after(self):
                pass
        """), "    "))
    sources = Sources(verify=False)
    (branch,) = find(at(path, "Module.hook"), sources=sources)
    assert (branch.kind, branch.text, branch.names) == ("decorator", "@on_rank(", ("on_rank(0)",))
    region = sources.region(path, branch.frame.line, "hook")
    assert not isinstance(region, str) and region.whole_file is False


def test_async_code(tmp_path: Path) -> None:
    path = write(tmp_path, """\
        async def serve(rank, stream):
            async for item in stream:
                if rank == 0:
                    await send(item)  # HERE
        """)
    (branch,) = find(at(path, "serve"))
    assert (branch.kind, branch.line) == ("if", 3)
    (loop,) = loops([at(path, "serve")], Sources(verify=False))
    assert (loop.line, loop.text) == (2, "async for item in stream:")


def test_decorated_nested_function(tmp_path: Path) -> None:
    path = write(tmp_path, """\
        def verify_operation(function):
            @functools.wraps(function)
            def wrapper(*args, **kwargs):
                if PartialState().process_index == 0:
                    return function(*args, **kwargs)  # HERE
            return wrapper
        """)
    (branch,) = find(at(path, "verify_operation.<locals>.wrapper"))
    assert branch.names == ("PartialState().process_index",)


# -- files that cannot be analysed -------------------------------------------------------------

def test_verified_source_is_analysed(tmp_path: Path) -> None:
    path = write(tmp_path, "def main(rank):\n    if rank:\n        go()  # HERE\n")
    sources = Sources({path: digest(Path(path).read_bytes())})
    assert kinds(find(at(path, "main"), sources=sources)) == [("if", 2)]


def test_changed_file(tmp_path: Path) -> None:
    path = write(tmp_path, "def main(rank):\n    if rank:\n        go()  # HERE\n")
    sources = Sources({path: digest(b"the source that ran")})
    found, skipped = branches([at(path, "main"), at(path, "main")], sources)
    assert found == () and [(s.path, s.why) for s in skipped] == [
        (path, "source changed since the run")]


def test_no_fingerprint_recorded(tmp_path: Path) -> None:
    path = write(tmp_path, "def main(rank):\n    if rank:\n        go()  # HERE\n")
    found, skipped = branches([at(path, "main")], Sources({}))
    assert [s.why for s in skipped] == ["no fingerprint recorded with the run"]


def test_deleted_file(tmp_path: Path) -> None:
    path = write(tmp_path, "def main(rank):\n    if rank:\n        go()  # HERE\n")
    frame = at(path, "main")
    Path(path).unlink()
    found, skipped = branches([frame], Sources({path: digest(b"")}))
    assert found == () and [s.why for s in skipped] == ["source missing"]
    assert loops([frame], Sources(verify=False)) == ()


def test_bad_encoding_and_a_coding_cookie(tmp_path: Path) -> None:
    body = "def main(rang\xe9, rank):\n    if rank:\n        go()  # HERE\n"
    bad = tmp_path / "bad.py"
    bad.write_bytes(body.encode("latin-1"))
    found, skipped = branches([Location(str(bad), 3, "main")], Sources(verify=False))
    assert found == () and skipped[0].why == "not UTF-8 at byte 13 (no coding declaration)"
    good = tmp_path / "good.py"
    good.write_bytes(("# -*- coding: latin-1 -*-\n" + body).encode("latin-1"))
    (branch,) = find(Location(str(good), 4, "main"))
    assert (branch.kind, branch.line) == ("if", 3)
    unknown = tmp_path / "unknown.py"
    unknown.write_bytes(b"# coding: klingon\n" + body.encode())
    _, skipped = branches([Location(str(unknown), 4, "main")], Sources(verify=False))
    assert skipped[0].why == "not decodable: unknown encoding: klingon"
    declared = tmp_path / "ascii.py"
    declared.write_bytes(b"# coding: ascii\n" + body.encode("latin-1"))
    _, skipped = branches([Location(str(declared), 4, "main")], Sources(verify=False))
    assert skipped[0].why == "not ascii at byte 29 (its declared encoding)"
    late = tmp_path / "late.py"  # past the two lines the cookie search reads
    late.write_bytes(b"\n\n\n" + body.encode("latin-1"))
    _, skipped = branches([Location(str(late), 6, "main")], Sources(verify=False))
    assert skipped[0].why == "not UTF-8 at byte 16 (no coding declaration)"


def test_syntax_error(tmp_path: Path) -> None:
    path = write(tmp_path, "def main(rank):\n    if rank\n        go()\n")
    found, skipped = branches([Location(path, 3, "main")], Sources(verify=False))
    assert found == () and skipped[0].why.startswith("syntax error at line 2")


def test_huge_file(tmp_path: Path) -> None:
    path = write(tmp_path, "def main(rank):\n    if rank:\n        go()\n" + "#" * 5000)
    found, skipped = branches([Location(path, 3, "main")], Sources(verify=False, max_bytes=4096))
    assert found == () and skipped[0].why == f"too large ({Path(path).stat().st_size} bytes)"


def test_line_beyond_the_end(tmp_path: Path) -> None:
    path = write(tmp_path, "def main(rank):\n    if rank:\n        go()\n")
    found, skipped = branches([Location(path, 4, "main")], Sources(verify=False))
    assert found == () and skipped[0].why == "line 4 is beyond the end of the file (3 lines)"
    _, skipped = branches([Location(path, 0, "main")], Sources(verify=False))
    assert skipped[0].why == "no line number"


def test_not_a_file(tmp_path: Path) -> None:
    frames = [Location("<string>", 1, "<module>"), Location("<frozen runpy>", 88, "_run_code")]
    found, skipped = branches(frames, Sources())
    assert found == () and [(s.path, s.why) for s in skipped] == [
        ("<string>", "no source file"), ("<frozen runpy>", "no source file")]


def test_each_file_read_once_and_the_number_of_files_bounded(tmp_path: Path) -> None:
    reads: list[str] = []

    def read(path: str) -> bytes:
        reads.append(path)
        return b"def main(rank):\n    if rank:\n        go()\n"

    sources = Sources(verify=False, max_files=2, read=read)
    frames = [Location(f"/src/{name}.py", 3, "main") for name in "aabbc"]
    found, skipped = branches(frames, sources)
    assert reads == ["/src/a.py", "/src/b.py"]
    assert [b.path for b in found] == ["/src/a.py", "/src/b.py"]
    assert [s.why for s in skipped] == ["more than 2 source files in one report"]


def test_a_failing_reader_never_raises() -> None:
    def read(path: str) -> bytes:
        raise PermissionError(13, "Permission denied")

    found, skipped = branches([Location("/x.py", 1, "f")], Sources(verify=False, read=read))
    assert skipped[0].why == "Permission denied"


def test_digest_format() -> None:
    value = digest(b"print(1)\n")
    assert value.startswith("blake2b:") and len(value) == len("blake2b:") + 32
    assert value != digest(b"print(2)\n")
