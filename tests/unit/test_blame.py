"""Who is wrong, and why (analysis/who/blame.py), on synthetic traces whose callsites point into
real source files written here: the branch settles the culprit, both or neither is said, a changed
file is never read, a loop run a different number of times is named."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from nccl_doctor.analysis import analyze
from nccl_doctor.diagnosis import FindingKind
from nccl_doctor.files import source_digest
from nccl_doctor.model import EventState, Location

SCRIPT = """\
import torch.distributed as dist


def main(rank, t):
    dist.all_reduce(t)
    if rank == 0:
        dist.barrier()
    dist.all_reduce(t)


def both(rank, t):
    if rank == 0:
        dist.barrier()
    else:
        dist.broadcast(t, src=1)


def two(rank, t):
    if rank == 0:
        dist.barrier()
    if rank == 1:
        dist.broadcast(t, src=1)


def neither(rank, t, n):
    for step in range(n):
        dist.all_reduce(t)
    dist.barrier()
"""


def line(text: str, after: int = 0) -> int:
    return next(n for n, s in enumerate(SCRIPT.splitlines(), 1) if n > after and text in s)


def write(tmp_path: Path) -> Path:
    path = tmp_path / "train.py"
    path.write_text(SCRIPT)
    return path


def fingerprinted(tb, traces, path: Path, data: bytes | None = None):
    """Each rank recorded the file's fingerprint (``data``'s: the file as it was at the run)."""
    digest = source_digest(data if data is not None else path.read_bytes())
    ranks = {r: replace(t, meta=replace(t.meta, sources={str(path): digest}))
             for r, t in traces.ranks.items()}
    return replace(traces, ranks=ranks)


def at(path: Path, n: int, function: str) -> Location:
    return Location(str(path), n, function)


def mismatch(tb, path: Path, first: Location, second: Location, second_op: str = "all_reduce"):
    """rank 0 in a barrier at ``first``, rank 1 in ``second_op`` at ``second``, both after one
    all_reduce made together."""
    together = at(path, line("dist.all_reduce(t)"), "main")
    r0 = [tb.event(1, callsite=together), tb.event(2, "barrier", input="", callsite=first,
                                                   state=EventState.ENTERED)]
    r1 = [tb.event(1, callsite=together), tb.event(2, second_op, callsite=second,
                                                   state=EventState.ENTERED)]
    return tb.traceset([tb.trace(0, r0, tb.RUNNING), tb.trace(1, r1, tb.RUNNING)],
                       groups={"0": (0, 1)})


def test_the_side_inside_the_branch_is_the_culprit(tb, tmp_path):
    path = write(tmp_path)
    barrier = at(path, line("dist.barrier()"), "main")
    after = at(path, line("dist.all_reduce(t)", after=line("if rank == 0:")), "main")
    traces = fingerprinted(tb, mismatch(tb, path, barrier, after), path)
    root = analyze(traces).root_cause
    assert root.kind is FindingKind.COLLECTIVE_MISMATCH
    assert root.ranks == (0,), root.detail  # without the branch: rank 1, the lowest rank's rule
    assert root.branch.line == line("if rank == 0:") and root.branch.kind == "if"
    assert root.branch.text == "if rank == 0:" and root.branch.ranks == (0,)
    assert root.evidence["blame"] == "branch"
    assert root.callsite.endswith(f"train.py:{barrier.line}")  # the culprit's call
    assert "rank 0 made this call inside the rank-dependent branch" in root.detail
    assert "lowest rank" not in root.detail and "Move the collective" in root.hint


def test_a_file_changed_since_the_run_is_not_read(tb, tmp_path):
    path = write(tmp_path)
    barrier = at(path, line("dist.barrier()"), "main")
    after = at(path, line("dist.all_reduce(t)", after=line("if rank == 0:")), "main")
    traces = fingerprinted(tb, mismatch(tb, path, barrier, after), path,
                           data=b"# the file as it was at the run\n" + path.read_bytes())
    root = analyze(traces).root_cause
    assert root.branch is None and root.ranks == (1,)  # the lowest rank's convention, said so
    assert root.evidence["blame"] == "lowest_rank"
    assert root.evidence["not_analysed"] == [{"path": str(path),
                                              "why": "source changed since the run"}]
    assert "source changed since the run" in root.detail


def test_without_fingerprints_nothing_is_read(tb, tmp_path):
    """Captures made before the ranks fingerprinted their files: never read, and said."""
    path = write(tmp_path)
    barrier = at(path, line("dist.barrier()"), "main")
    after = at(path, line("dist.all_reduce(t)", after=line("if rank == 0:")), "main")
    root = analyze(mismatch(tb, path, barrier, after)).root_cause
    assert root.branch is None
    assert "no fingerprint recorded with the run" in root.evidence["not_analysed"][0]["why"]


def test_an_if_and_its_else_blame_the_ranks_in_the_if(tb, tmp_path):
    path = write(tmp_path)
    start = line("def both")
    barrier = at(path, line("dist.barrier()", after=start), "both")
    bcast = at(path, line("dist.broadcast(t, src=1)"), "both")
    traces = fingerprinted(tb, mismatch(tb, path, barrier, bcast, "broadcast"), path)
    root = analyze(traces).root_cause
    # rank 0 is in the if, rank 1 in its else: the else is the others' default path, so rank 0
    # took the branch that rank 1's call skips
    assert root.ranks == (0,) and root.branch.ranks == (0,), root.detail
    assert root.branch.line == line("if rank == 0:", after=start)


def test_both_sides_in_a_branch_of_their_own_is_said_and_decides_nothing(tb, tmp_path):
    path = write(tmp_path)
    start = line("def two")
    barrier = at(path, line("dist.barrier()", after=start), "two")
    bcast = at(path, line("dist.broadcast(t, src=1)", after=start), "two")
    traces = fingerprinted(tb, mismatch(tb, path, barrier, bcast, "broadcast"), path)
    root = analyze(traces).root_cause
    assert root.evidence["blame"] == "both_branched" and root.ranks == (1,), root.detail
    assert "Both sides took a rank-dependent branch" in root.detail
    assert "may lie on either side" in root.detail
    assert {(b["line"], tuple(b["ranks"])) for b in root.evidence["branches"]} == {
        (line("if rank == 0:", after=start), (0,)), (line("if rank == 1:", after=start), (1,))}


def test_no_branch_names_the_loop_run_a_different_number_of_times(tb, tmp_path):
    path = write(tmp_path)
    start = line("def neither")
    inside = at(path, line("dist.all_reduce(t)", after=start), "neither")
    barrier = at(path, line("dist.barrier()", after=start), "neither")
    r0 = [tb.event(i, callsite=inside) for i in range(1, 4)] + [
        tb.event(4, "barrier", input="", callsite=barrier, state=EventState.ENTERED)]
    r1 = [tb.event(i, callsite=inside) for i in range(1, 4)] + [
        tb.event(4, callsite=inside, state=EventState.ENTERED)]
    traces = fingerprinted(tb, tb.traceset([tb.trace(0, r0, tb.RUNNING),
                                            tb.trace(1, r1, tb.RUNNING)],
                                           groups={"0": (0, 1)}), path)
    root = analyze(traces).root_cause
    assert root.branch is None and root.evidence["blame"] == "lowest_rank"
    loop = root.evidence["loop"]
    assert loop["line"] == line("for step in range(n):") and loop["fewer_calls"] == {"0": 1,
                                                                                      "1": 0}
    assert "rank 0 made 1 call fewer than rank 1" in root.detail, root.detail


def test_each_side_says_its_line_of_yours_with_its_code(tb, tmp_path):
    path = write(tmp_path)
    barrier = at(path, line("dist.barrier()"), "main")
    after = at(path, line("dist.all_reduce(t)", after=line("if rank == 0:")), "main")
    root = analyze(fingerprinted(tb, mismatch(tb, path, barrier, after), path)).root_cause
    sides = {tuple(s["ranks"]): s for s in root.evidence["sides"]}
    assert sides[(0,)]["your_code"] == "dist.barrier()"
    assert sides[(1,)]["your_line"].endswith(f"train.py:{after.line}")
    assert f"rank 1: your {sides[(1,)]['your_line']} `dist.all_reduce(t)`" in root.detail


def test_a_line_of_nccl_doctors_own_trainers_is_not_called_the_users():
    from nccl_doctor import paths
    from nccl_doctor.trainers import preference
    from nccl_doctor.reproducers import cpo_logits_gather

    assert paths.whose(preference.__file__) == "nccl-doctor's "
    assert paths.whose(cpo_logits_gather.__file__) == "nccl-doctor's "
    assert paths.whose("/home/me/train.py") == "your "
    assert paths.whose(paths.__file__) == ""  # nccl-doctor's own library code is no user's
