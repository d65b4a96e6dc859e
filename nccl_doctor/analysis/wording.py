"""Shared wording for findings: how to name a call, a rank's fate, a list of ranks."""

from __future__ import annotations

from nccl_doctor.model import Event, Location, RankTrace


def site(c: Location | None) -> str:
    return c.text() if c is not None else "?"


def call_site(e: Event) -> str:
    return site(e.callsite or e.api_callsite)


def call_name(e: Event) -> str:
    """``all_gather #3 (group 0)``."""
    return f"{e.op} #{e.align_seq} (group {e.group})"


def runs(ranks) -> list[list[int]]:
    """The ranks, sorted, cut into runs of consecutive numbers: [0, 1, 2, 5] -> [[0, 1, 2], [5]]."""
    out: list[list[int]] = []
    for r in sorted(ranks):
        if out and r == out[-1][-1] + 1:
            out[-1].append(r)
        else:
            out.append([r])
    return out


def ranks_text(ranks: list[int] | tuple[int, ...]) -> str:
    if len(ranks) == 1:
        return f"rank {ranks[0]}"
    # runs of three or more as ranges: 1,023 ranks of a 1,024-rank job read "0-636, 638-1023"
    parts = [f"{run[0]}-{run[-1]}" if len(run) >= 3 else ", ".join(map(str, run))
             for run in runs(ranks)]
    return "ranks " + ", ".join(parts)


def fate(trace: RankTrace) -> str:
    """What became of a rank, with where: 'exited cleanly after train.py:40 (all_reduce #9)'."""
    from nccl_doctor.analysis.align import last_leaf

    last = last_leaf(trace)
    after = f" after {call_site(last)} ({call_name(last)})" if last is not None else ""
    text = trace.exit.describe()
    if trace.exit.callsite is not None:
        text += f" at {site(trace.exit.callsite)}"
    return text + after
