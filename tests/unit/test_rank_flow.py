"""The rank carried across calls (source/rank_flow.py, through source/branch.py): a
rank-derived argument bound to a parameter along the recorded call path, a helper's return, an
attribute a method sets, a property; and what must not count (a decoy flag that does not decide
the call, a caller that is not the one on the path, a library's own code, the bounds). Every
source is written to tmp_path; frames point at lines marked ``# HERE`` (``# CALLER``, ...)."""

from __future__ import annotations

from pathlib import Path

from nccl_doctor.source import rank_flow
from nccl_doctor.paths import short_path as short
from nccl_doctor.source.branch import Branch
from nccl_doctor.location import Location
from tests.unit.test_branch import at, find, write


def summary(found: tuple[Branch, ...]) -> list[tuple[str, str, tuple[str, ...]]]:
    return [(b.kind, b.text, b.names) for b in found]


SHARE = """\
    import torch.distributed as dist


    def share(t, is_main):
        if is_main:
            dist.all_reduce(t)  # HERE
        else:
            dist.broadcast(t, src=0)  # ELSE
        return t


    def main(rank, t):
        share(t, is_main=(rank == 0))  # CALLER
        share(t, rank == 0)  # POSITIONAL
        share(t, is_main=True)  # CONSTANT
        other(t, is_main=(rank == 0))  # OTHER
    """


def test_a_rank_flag_passed_as_a_keyword_is_followed_into_the_callee(tmp_path: Path) -> None:
    path = write(tmp_path, SHARE)
    found = find(at(path, "share"), at(path, "main", "# CALLER"))
    assert summary(found) == [("if", "if is_main:", ("is_main",))]
    (branch,) = found
    caller = at(path, "main", "# CALLER")
    # (the argument's text as the tree holds it: without its parentheses)
    assert branch.via == (f"`is_main` is `rank == 0`, passed at {short(caller.path)}:"
                          f"{caller.line}",)
    # the else arm, on the other side
    found = find(at(path, "share", "# ELSE"), at(path, "main", "# CALLER"))
    assert summary(found) == [("else", "if is_main:", ("is_main",))]


def test_a_positional_argument_is_bound_too(tmp_path: Path) -> None:
    path = write(tmp_path, SHARE)
    (branch,) = find(at(path, "share"), at(path, "main", "# POSITIONAL"))
    assert branch.names == ("is_main",) and "`is_main` is `rank == 0`" in branch.via[0]


def test_a_constant_argument_or_no_caller_on_the_path_is_not_the_rank(tmp_path: Path) -> None:
    path = write(tmp_path, SHARE)
    assert find(at(path, "share"), at(path, "main", "# CONSTANT")) == ()
    # the next frame out does not call share on its line: not its caller, nothing bound
    assert find(at(path, "share"), at(path, "main", "# OTHER")) == ()
    assert find(at(path, "share")) == ()


def test_a_parameter_is_followed_through_several_callers(tmp_path: Path) -> None:
    path = write(tmp_path, """\
        import torch.distributed as dist


        def inner(t, leader):
            if leader:
                dist.barrier()  # HERE
            return t


        def middle(t, flag):
            return inner(t, flag and t is not None)  # MIDDLE


        def main(rank, t):
            middle(t, rank == 0)  # OUTER
        """)
    frames = (at(path, "inner"), at(path, "middle", "# MIDDLE"), at(path, "main", "# OUTER"))
    (branch,) = find(*frames)
    assert branch.names == ("leader",)
    assert "`leader` is `flag and t is not None`" in branch.via[0]
    # the outermost caller cut off: flag is nobody's, and nothing is found
    assert find(*frames[:2]) == ()


def chain(tmp_path: Path, links: int) -> tuple[Location, ...]:
    """f0 branches on its flag; f1..f<links> pass it on; main passes ``rank == 0``: the
    rank is ``links + 1`` callers out from f0. The frames, innermost first."""
    body = "\n\n".join(f"def f{k}(t, flag):\n    return f{k - 1}(t, flag)  # F{k}"
                        for k in range(1, links + 1))
    path = write(tmp_path, f"""\
import torch.distributed as dist


def f0(t, flag):
    if flag:
        dist.barrier()  # HERE
    return t


{body}


def main(rank, t):
    f{links}(t, rank == 0)  # OUTER
""", name=f"chain{links}.py")
    return (at(path, "f0"), *(at(path, f"f{k}", f"# F{k}") for k in range(1, links + 1)),
            at(path, "main", "# OUTER"))


def test_the_call_depth_is_bounded(tmp_path: Path) -> None:
    within = chain(tmp_path, rank_flow.MAX_CALL_DEPTH - 1)
    (branch,) = find(*within)
    assert branch.names == ("flag",)
    assert find(*within[:-1]) == ()  # the caller that passed the rank cut off
    assert find(*chain(tmp_path, rank_flow.MAX_CALL_DEPTH)) == ()  # one caller too far


def test_a_helpers_return_carries_the_rank(tmp_path: Path) -> None:
    path = write(tmp_path, """\
        import torch.distributed as dist


        def is_main():
            return dist.get_rank() == 0


        def should_log(step):
            return step % 10 == 0


        def main(t, step):
            if is_main():
                dist.barrier()  # HERE
            if should_log(step):
                dist.all_reduce(t)  # HERE2
        """)
    (branch,) = find(at(path, "main"))
    assert branch.names == ("is_main()",)
    assert branch.via == (f"`is_main()` returns `dist.get_rank() == 0` ({short(path)}:5)",)
    assert find(at(path, "main", "# HERE2")) == ()  # a helper not on the rank


def test_a_helper_through_a_helper_and_through_a_variable(tmp_path: Path) -> None:
    path = write(tmp_path, """\
        import torch.distributed as dist


        def my_rank():
            r = dist.get_rank()
            return r


        def leader():
            return my_rank() == 0


        def main(t):
            lead = leader()
            if lead:
                dist.barrier()  # HERE
        """)
    (branch,) = find(at(path, "main"))
    assert branch.names == ("lead",)


def test_an_attribute_set_from_the_rank_in_another_method(tmp_path: Path) -> None:
    path = write(tmp_path, """\
        import torch.distributed as dist


        class Worker:
            def __init__(self, rank):
                self.is_main = rank == 0
                self.steps = 3

            def step(self, t):
                if self.is_main:
                    dist.broadcast(t, src=0)  # HERE
                if self.steps > 2:
                    dist.all_reduce(t)  # HERE2
        """)
    (branch,) = find(at(path, "Worker.step"))
    assert branch.names == ("self.is_main",)
    assert branch.via == (
        f"`self.is_main` is set to `rank == 0` in Worker.__init__ ({short(path)}:6)",)
    assert find(at(path, "Worker.step", "# HERE2")) == ()


def test_a_property_and_a_method_of_the_class(tmp_path: Path) -> None:
    path = write(tmp_path, """\
        import os
        import torch.distributed as dist


        class Runner:
            def __init__(self):
                self.me = int(os.environ["RANK"])

            @property
            def leads(self):
                return self.me == 0

            def chief(self):
                return self.leads

            def step(self, t):
                if self.leads:
                    dist.barrier()  # HERE
                if self.chief():
                    dist.barrier()  # HERE2
        """)
    (branch,) = find(at(path, "Runner.step"))
    assert branch.names == ("self.leads",) and "returns `self.me == 0`" in branch.via[0]
    (branch,) = find(at(path, "Runner.step", "# HERE2"))
    assert branch.names == ("self.chief()",)


def test_a_framework_property_is_the_rank_by_its_name(tmp_path: Path) -> None:
    path = write(tmp_path, """\
        def save(accelerator, trainer, state, args, t):
            if accelerator.is_local_main_process:
                accelerator.wait_for_everyone()  # HERE
            if state.process_index == 0 and trainer.is_global_zero:
                trainer.strategy.barrier()  # HERE2
            if args.local_rank in (-1, 0):
                trainer.strategy.barrier()  # HERE3
        """)
    assert find(at(path, "save"))[0].names == ("accelerator.is_local_main_process",)
    assert find(at(path, "save", "# HERE2"))[0].names == ("state.process_index",
                                                          "trainer.is_global_zero")
    assert find(at(path, "save", "# HERE3"))[0].names == ("args.local_rank",)


def test_a_decoy_flag_that_does_not_decide_the_call_is_not_named(tmp_path: Path) -> None:
    path = write(tmp_path, """\
        import torch.distributed as dist


        def share(t, is_main):
            if is_main:
                print("sharing", t.sum())
            dist.all_reduce(t)  # HERE
            return t


        def main(rank, t):
            share(t, is_main=(rank == 0))  # CALLER
        """)
    assert find(at(path, "share"), at(path, "main", "# CALLER")) == ()


def test_a_librarys_own_helpers_are_not_followed(tmp_path: Path) -> None:
    """Installed code is read by its names alone: its helpers and attributes are not followed
    (cost, and what a framework's flags are called says enough)."""
    library = write(tmp_path, """\
        import torch.distributed as dist


        def leads():
            return dist.get_rank() == 0


        def step(t):
            if leads():
                dist.barrier()  # HERE
        """, name="lib/python3.11/site-packages/acme/__init__.py")
    assert find(at(library, "step")) == ()


def test_a_rank_flag_passed_from_your_code_into_a_library(tmp_path: Path) -> None:
    library = write(tmp_path, """\
        import torch.distributed as dist


        def share(t, main_process=False):
            if main_process:
                dist.all_reduce(t)  # HERE
            return t
        """, name="lib/python3.11/site-packages/acme/__init__.py")
    user = write(tmp_path, """\
        import acme


        def main(rank, t):
            acme.share(t, main_process=rank == 0)  # CALLER
        """)
    (branch,) = find(at(library, "share"), at(user, "main", "# CALLER"))
    assert branch.names == ("main_process",) and branch.path == library


def test_following_stops_at_the_definitions_bound(tmp_path: Path) -> None:
    helpers = "\n\n".join(f"def h{k}():\n    return 0" for k in range(rank_flow.MAX_DEFINITIONS))
    # assignments: the names each takes are read for the rank (a helper followed each)
    conditions = "\n".join(f"    v{k} = h{k}()" for k in range(rank_flow.MAX_DEFINITIONS))
    path = write(tmp_path, f"""\
import torch.distributed as dist


{helpers}


def is_main():
    return dist.get_rank() == 0


def main(t):
{conditions}
    if v0 or is_main():
        dist.barrier()  # HERE
""")
    # every helper before is_main() took a definition of the report's budget: past the bound a
    # value is not the rank's (names less, never more)
    assert find(at(path, "main")) == ()
    # a report with budget left finds it
    only = write(tmp_path, """\
        import torch.distributed as dist


        def is_main():
            return dist.get_rank() == 0


        def main(t):
            if is_main():
                dist.barrier()  # HERE
        """, name="small.py")
    assert find(at(only, "main"))[0].names == ("is_main()",)


def test_helpers_are_followed_to_a_bounded_depth(tmp_path: Path) -> None:
    def script(links: int) -> str:
        helpers = "\n\n".join(f"def h{k}():\n    return h{k - 1}()" for k in range(1, links + 1))
        return f"""\
import torch.distributed as dist


def h0():
    return dist.get_rank() == 0


{helpers}


def main():
    if h{links}():
        dist.barrier()  # HERE
"""
    within = write(tmp_path, script(rank_flow.MAX_HELPER_DEPTH - 1), name="within.py")
    assert find(at(within, "main"))[0].names == (f"h{rank_flow.MAX_HELPER_DEPTH - 1}()",)
    beyond = write(tmp_path, script(rank_flow.MAX_HELPER_DEPTH), name="beyond.py")
    assert find(at(beyond, "main")) == ()
