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


def ranks_text(ranks: list[int] | tuple[int, ...]) -> str:
    ranks = sorted(ranks)
    if len(ranks) == 1:
        return f"rank {ranks[0]}"
    if len(ranks) > 2 and ranks == list(range(ranks[0], ranks[-1] + 1)):
        return f"ranks {ranks[0]}-{ranks[-1]}"
    # runs of three or more as ranges: 1,023 ranks of a 1,024-rank job read "0-636, 638-1023"
    parts: list[str] = []
    run: list[int] = []
    for r in [*ranks, None]:
        if r is not None and run and r == run[-1] + 1:
            run.append(r)
            continue
        if len(run) >= 3:
            parts.append(f"{run[0]}-{run[-1]}")
        else:
            parts.extend(str(x) for x in run)
        run = [r] if r is not None else []
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
