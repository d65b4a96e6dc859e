"""A jump the data decided (analysis/why/data_jumps.py, branch.data_jumps): read in source, and
shown by the calls - every rank made as many calls before the jump in the loop, some fewer from
the line after it. Sources written to tmp_path; synthetic traces whose callsites point into them."""

from __future__ import annotations

import textwrap
from dataclasses import replace
from pathlib import Path

from nccl_doctor.analysis import analyze
from nccl_doctor.source.branch import data_jumps
from nccl_doctor.source.source_text import Sources
from nccl_doctor.diagnosis import FindingKind
from nccl_doctor.files import source_digest
from nccl_doctor.location import Location
from nccl_doctor.model import EventState


def write(tmp_path: Path, source: str, name: str = "train.py") -> Path:
    path = tmp_path / name
    path.write_text(textwrap.dedent(source))
    return path


def line(path: Path, text: str) -> int:
    return next(n for n, s in enumerate(path.read_text().splitlines(), 1) if text in s)


def at(path: Path, text: str, function: str = "train") -> Location:
    return Location(str(path), line(path, text), function)


# -- in source ---------------------------------------------------------------------------------

def test_a_nan_guard_before_the_call_in_its_loop(tmp_path: Path) -> None:
    path = write(tmp_path, """\
        import torch
        import torch.distributed as dist

        def train(rank, loader, grad):
            if rank == 5:
                return
            for batch in loader:
                if batch is None:
                    break
                loss = batch.sum()
                dist.all_reduce(loss)
                if not torch.isfinite(loss):
                    continue
                if rank == 1:
                    continue
                if loss > 10:
                    print("large")
                dist.all_reduce(grad)
        """)
    found = data_jumps([at(path, "dist.all_reduce(grad)")], Sources(verify=False))
    # nearest first; the rank's own jump (a branch on the rank) and an if that does not leave
    # are not data jumps, nor a return before the loop
    assert [(j.branch.line, j.leaves) for j in found] == [
        (line(path, "if not torch.isfinite(loss):"), "continue"),
        (line(path, "if batch is None:"), "break")]
    jump = found[0]
    assert jump.branch.kind == "jump" and jump.branch.names == () and jump.branch.skips
    assert jump.loop.line == line(path, "for batch in loader:")


def test_no_loop_no_data_jump_and_raise_counts(tmp_path: Path) -> None:
    path = write(tmp_path, """\
        import torch.distributed as dist

        def train(x, steps):
            if x is None:
                return
            dist.all_reduce(x)
            while steps:
                if x.isnan().any():
                    raise ValueError("nan")
                dist.barrier()
                steps -= 1
        """)
    sources = Sources(verify=False)
    assert data_jumps([at(path, "dist.all_reduce(x)")], sources) == ()
    (jump,) = data_jumps([at(path, "dist.barrier()")], sources)
    assert jump.leaves == "raise" and jump.branch.line == line(path, "if x.isnan().any():")


# -- shown by the calls ------------------------------------------------------------------------

SCRIPT = """\
import torch
import torch.distributed as dist


def train(loader, grad, tp, dp):
    for batch in loader:
        loss = batch.sum()
        dist.all_reduce(loss, group=tp)
        if not torch.isfinite(loss):
            continue
        dist.all_reduce(grad, group=dp)
    dist.barrier()


def bare(loader, grad):
    for batch in loader:
        if not torch.isfinite(batch.sum()):
            continue
        dist.all_reduce(grad)
    dist.barrier()
"""


def fingerprinted(traces, path: Path):
    digest = source_digest(path.read_bytes())
    ranks = {r: replace(t, meta=replace(t.meta, sources={str(path): digest}))
             for r, t in traces.ranks.items()}
    return replace(traces, ranks=ranks)


def skipped_once(tb, path: Path, before: Location | None, after: Location, last: Location):
    """Two ranks, 3 steps: rank 0 skips step 2's call at ``after`` (group "dp"); every rank
    makes the call at ``before`` (group "tp") each step when given. Rank 0 ends in the barrier
    at ``last``, rank 1 waits in its 3rd call at ``after``."""
    events: dict[int, list] = {0: [], 1: []}
    for r in (0, 1):
        seqs = {"tp": 0, "dp": 0}
        for step in range(3):
            if before is not None:
                seqs["tp"] += 1
                events[r].append(("tp", seqs["tp"], before, EventState.RETURNED))
            if r == 0 and step == 1:
                continue
            seqs["dp"] += 1
            state = EventState.ENTERED if r == 1 and step == 2 else EventState.RETURNED
            events[r].append(("dp", seqs["dp"], after, state))
    events[0].append(("0", 1, last, EventState.ENTERED))
    traces = []
    for r in (0, 1):
        made = [tb.event(i, "barrier" if g == "0" else "all_reduce", group=g, seq=seq,
                         input="" if g == "0" else "float32[4]", callsite=where, state=state)
                for i, (g, seq, where, state) in enumerate(events[r], 1)]
        traces.append(tb.trace(r, made, tb.RUNNING))
    return fingerprinted(tb.traceset(traces, groups={"0": (0, 1), "tp": (0, 1),
                                                     "dp": (0, 1)}), path)


def test_the_ranks_that_took_a_nan_guard_are_named_as_data(tb, tmp_path):
    path = write(tmp_path, SCRIPT)
    traces = skipped_once(tb, path, at(path, "dist.all_reduce(loss, group=tp)"),
                          at(path, "dist.all_reduce(grad, group=dp)"),
                          at(path, "dist.barrier()"))
    findings = [f for f in analyze(traces).findings
                if f.kind is FindingKind.MISSING_COLLECTIVE]
    assert findings
    for f in findings:
        jump = f.evidence["data_jump"]
        assert jump["line"] == line(path, "if not torch.isfinite(loss):"), f.detail
        assert jump["ranks"] == [0] and jump["times"] == {"0": 1, "1": 0}
        assert jump["agree_line"] == line(path, "dist.all_reduce(loss, group=tp)")
        assert f.branch.ranks == (0,) and f.branch.kind == "jump" and f.branch.skips
        assert not f.branch.culprit and f.branch.names == ()
        assert "rank 0 took the `continue` at" in f.detail
        assert "because of the data, not the rank number" in f.detail
        assert "reduce the condition across the ranks" in f.hint


def test_without_calls_before_the_jump_a_skip_is_not_told_from_a_shorter_loop(tb, tmp_path):
    """Only the call after the guard: a rank with fewer calls may have run the loop fewer
    times. No jump is named; the loop's counts are said instead."""
    path = write(tmp_path, SCRIPT)
    traces = skipped_once(tb, path, None, at(path, "dist.all_reduce(grad)", "bare"),
                          at(path, "dist.barrier()", "bare"))
    findings = [f for f in analyze(traces).findings
                if f.kind is FindingKind.MISSING_COLLECTIVE]
    assert findings
    for f in findings:
        assert "data_jump" not in f.evidence and f.branch is None, f.detail
        assert "because of the data" not in f.detail


def test_a_changed_file_names_no_data_jump(tb, tmp_path):
    path = write(tmp_path, SCRIPT)
    traces = skipped_once(tb, path, at(path, "dist.all_reduce(loss, group=tp)"),
                          at(path, "dist.all_reduce(grad, group=dp)"),
                          at(path, "dist.barrier()"))
    path.write_text("# edited after the run\n" + SCRIPT)
    findings = analyze(traces).findings
    assert findings
    for f in findings:
        assert "data_jump" not in f.evidence and f.branch is None
