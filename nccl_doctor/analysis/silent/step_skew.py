"""``step_skew``: the ranks still pair their calls, but from different steps (pure).

A rank that skips one step's call (a NaN guard's ``continue`` before a data-parallel all_reduce)
and makes it again the next step pairs its call #k with its peers' call #k from the step
before: nothing hangs while every rank goes on making the call, and every call after the skip
mixes two steps (gradients averaged across steps). At the end of a job whose loop runs a fixed
number of times the last call waits alone (a missing collective); a loop that counts its
successful steps never hangs at all.

Each call's step is read from its own rank's calls, never from the clock: a *marker* is another
call site in the same file that every rank of the group makes on every pass of the loop (the
tensor-parallel loss all_reduce before the guard). A site is a marker when, on every rank,
the marker calls before the first call of the site and between each two of its calls number
a multiple, at least 1, of the fewest seen: a pass skipped shows as a double count there, a
marker that was itself skipped as none (and then it is no marker). A call's step is how many
passes of markers its rank had made before it. Compared per group and per aligned call, from
the first call on; a capture that lost its first records (a lapped ring) is not read, its
steps are not counted from its start.

The reason, when the source shows one: the data-driven jump before the call in the loop that
holds it (analysis/why/branch.py ``data_jumps``), with the ranks that skipped a step.
"""

from __future__ import annotations

from bisect import bisect_left
from collections import defaultdict
from dataclasses import dataclass
from typing import Any

from nccl_doctor import paths
from nccl_doctor.analysis.calls.align import leaf_collectives
from nccl_doctor.analysis.calls.wording import call_fields, ranks_text
from nccl_doctor.analysis.who.blame import sources_for
from nccl_doctor.analysis.why.branch import data_jumps
from nccl_doctor.diagnosis import Finding, FindingKind, Severity
from nccl_doctor.location import Location
from nccl_doctor.model import Event, EventState, TraceSet
from nccl_doctor.redact import source_line

__all__ = ["detect_step_skew"]

#: markers tried per call site (the most frequent first): a loop makes a few calls a pass
_MARKERS = 8

HINT = ("A rank skipped one step's call and made the next step's, so its calls pair with its "
        "peers' calls of another step: every call after the skip mixes two steps. Decide the "
        "skip on every rank alike (reduce the condition across the ranks first, e.g. "
        "`dist.all_reduce(bad, op=dist.ReduceOp.MAX)` on a flag, and skip together), or make "
        "the call on every step and zero what it carries.")

_PAIRED = (EventState.RETURNED, EventState.ISSUED)  # a call its peers' calls answered
_Site = tuple[str, int, str]  # path, line, op: where a rank makes a call


def _where(e: Event) -> Location | None:
    """The line that issued the call (a library's, when one did), else the user's."""
    return e.issuing or e.callsite or e.api_callsite


def _site(e: Event) -> _Site | None:
    loc = _where(e)
    return (loc.path, loc.line, e.op) if loc is not None else None


@dataclass(frozen=True)
class _Marker:
    site: _Site
    per_pass: int  # marker calls a pass of the loop makes
    idx: dict[int, list[int]]  # rank -> its marker calls' record numbers, in order

    def step(self, rank: int, e: Event) -> int:
        """The pass of the loop ``e`` was made in (1-based): the marker calls before it."""
        return bisect_left(self.idx[rank], e.idx) // self.per_pass


@dataclass(frozen=True)
class _Skew:
    group: str
    first: dict[int, Event]  # rank -> its call of the first aligned call whose steps differ
    steps: dict[int, int]  # rank -> that call's step
    skipped: dict[int, tuple[int, ...]]  # rank -> the steps it made no call of the site in
    pairs: int  # aligned calls of the group whose steps differ
    marker: _Marker


def detect_step_skew(traces: TraceSet) -> list[Finding]:
    by_site = _calls_by_site(traces)
    skews: dict[_Site, list[_Skew]] = defaultdict(list)
    groups: dict[str, set[_Site]] = defaultdict(set)  # group -> the sites its calls came from
    for calls in by_site.values():
        for site, group in calls:
            groups[group].add(site)
    for name, sites in sorted(groups.items()):
        members = tuple(r for r in traces.group_members(name) if r in by_site)
        if len(members) < 2:
            continue
        for site in sorted(sites):
            if any((site, name) not in by_site[r] for r in members):
                continue
            marker = _marker(by_site, site, name, members)
            if marker is not None:
                skew = _skew(by_site, site, name, members, marker)
                if skew is not None:
                    skews[site].append(skew)
    return [_finding(traces, site, found) for site, found in sorted(skews.items())]


def _skew(by_site: dict[int, dict[tuple[_Site, str], list[Event]]], site: _Site, group: str,
          members: tuple[int, ...], marker: _Marker) -> _Skew | None:
    """The first call of ``site`` in ``group`` that every member made (and returned from) whose
    steps differ, with how many do; None when every such call pairs the same step."""
    calls = {r: [e for e in by_site[r][(site, group)] if e.state in _PAIRED] for r in members}
    seqs = {r: [e.align_seq for e in calls[r]] for r in members}
    if any(seqs[r] != seqs[members[0]] for r in members):  # (a window, a rank behind)
        common = set.intersection(*(set(v) for v in seqs.values()))
        calls = {r: [e for e in calls[r] if e.align_seq in common] for r in members}
    steps = [[bisect_left(marker.idx[r], e.idx) // marker.per_pass for e in calls[r]]
             for r in members]
    parted = [i for i, at in enumerate(zip(*steps)) if min(at) != max(at)]
    first, pairs = None, len(parted)
    if parted:
        i = parted[0]
        first = ({r: calls[r][i] for r in members},
                 {r: steps[k][i] for k, r in enumerate(members)})
    if first is None:
        return None
    return _Skew(group, first[0], first[1], _skipped(by_site, site, group, marker, members),
                 pairs, marker)


def _calls_by_site(traces: TraceSet) -> dict[int, dict[tuple[_Site, str], list[Event]]]:
    """rank -> (site, group) -> its calls there, in order; ranks whose capture lost its first
    records are left out (their steps cannot be counted from the start)."""
    out: dict[int, dict[tuple[_Site, str], list[Event]]] = {}
    for rank, trace in traces.ranks.items():
        if not trace.events or trace.events[0].idx != 1:
            continue
        calls: dict[tuple[_Site, str], list[Event]] = defaultdict(list)
        for e in leaf_collectives(trace):
            site = _site(e)
            if site is not None:
                calls[(site, e.group)].append(e)
        out[rank] = calls
    return out


def _marker(by_site: dict[int, dict[tuple[_Site, str], list[Event]]], site: _Site, group: str,
            members: tuple[int, ...]) -> _Marker | None:
    """A call site of the same file that every member makes on every pass of the loop, before
    ``site``'s call (see the module's docstring); None when none is."""
    own = {r: [e.idx for e in by_site[r].get((site, group), [])] for r in members}
    if any(not idx for idx in own.values()):
        return None
    candidates: dict[_Site, dict[int, list[int]]] = defaultdict(dict)
    for r in members:
        per_site: dict[_Site, list[int]] = defaultdict(list)
        for (other, _), events in by_site[r].items():
            if other != site and other[0] == site[0]:
                per_site[other].extend(e.idx for e in events)
        for other, idx in per_site.items():
            candidates[other][r] = sorted(idx)
    shared = [(s, idx) for s, idx in candidates.items() if set(idx) == set(members)]
    shared.sort(key=lambda item: (-min(len(v) for v in item[1].values()), item[0]))
    for other, idx in shared[:_MARKERS]:
        counts = [c for r in members for c in _between(idx[r], own[r])]
        least = min(counts)
        if least >= 1 and all(c % least == 0 for c in counts):
            return _Marker(other, least, idx)
    return None


def _between(marks: list[int], calls: list[int]) -> list[int]:
    """How many ``marks`` come before the first of ``calls`` and between each two of them."""
    out, prev = [], 0
    for c in calls:
        at = bisect_left(marks, c)
        out.append(at - prev)
        prev = at
    return out


def _skipped(by_site: dict[int, dict[tuple[_Site, str], list[Event]]], site: _Site, group: str,
             marker: _Marker, members: tuple[int, ...]) -> dict[int, tuple[int, ...]]:
    """rank -> the steps (1-based) it made no call of ``site`` in, up to its last call."""
    out = {}
    for r in members:
        steps = [marker.step(r, e) for e in by_site[r][(site, group)]]
        made = set(steps)
        missing = tuple(s for s in range(1, max(steps, default=0)) if s not in made)
        if missing:
            out[r] = missing
    return out


def _finding(traces: TraceSet, site: _Site, skews: list[_Skew]) -> Finding:
    # the earliest call of the loop that parted, in the group of the lowest ranks
    first = min(skews, key=lambda s: (next(iter(s.first.values())).align_seq, min(s.first)))
    any_call = next(iter(first.first.values()))
    op, seq = any_call.op, any_call.align_seq
    ahead = sorted(r for s in skews for r, st in s.steps.items() if st > min(s.steps.values()))
    skipped = {r: st for s in skews for r, st in s.skipped.items()}
    culprits = sorted(skipped) or ahead
    low, high = min(first.steps.values()), max(first.steps.values())
    r_high = min(r for r, st in first.steps.items() if st == high)
    r_low = min(r for r, st in first.steps.items() if st == low)
    members = traces.group_members(first.group)
    where = f"{paths.short_path(site[0])}:{site[1]}"
    mpath, mline, mop = first.marker.site
    marker = f"{paths.short_path(mpath)}:{mline}"
    title = (f"{op} #{seq} of group {first.group} {list(members)} paired rank {r_high}'s step "
             f"{high} with rank {r_low}'s step {low}: the ranks' calls at {where} come from "
             "different steps (silent desync)")
    groups = "; ".join(
        f"group {s.group} {list(traces.group_members(s.group))}: {s.pairs} call"
        f"{'s' if s.pairs != 1 else ''} from #{next(iter(s.first.values())).align_seq} on"
        for s in skews)
    lines = [
        f"The {op} at {where} still pairs on every rank, but not the same steps: {groups}. "
        f"A step is a pass of the loop, counted by the {mop} at {marker} that every rank makes "
        f"{_times(first.marker.per_pass)} a pass.",
        "; ".join(f"{ranks_text(list(rs))} made no {op} at {where} in step"
                  f"{'s' if len(st) > 1 else ''} {', '.join(map(str, st))}"
                  for st, rs in _by_steps(skipped))
        + ": from then on each of their calls pairs with a peer's call of another step. "
          "Nothing hangs while every rank goes on, but each call after the skip mixes data of "
          "two steps (gradients averaged across different steps)."
        if skipped else "",
    ]
    evidence: dict[str, Any] = {
        "steps": {str(r): st for r, st in sorted(first.steps.items())},
        "skipped": {str(r): list(st) for r, st in sorted(skipped.items())},
        "groups": [{"group": s.group, "seq": next(iter(s.first.values())).align_seq,
                    "pairs": s.pairs} for s in skews],
        "marker": {"path": mpath, "line": mline, "op": mop, "per_step": first.marker.per_pass},
    }
    jump = _jump(traces, first.first[culprits[0]] if culprits[0] in first.first else any_call)
    hint = HINT
    if jump is not None:
        b = jump.branch
        text = source_line(b.text)
        lines.append(f"The `{jump.leaves}` at {paths.short_path(b.path)}:{b.line} (`{text}`) "
                     f"leaves the loop's pass before the {op}: its condition differs per rank "
                     "because of the data, not the rank number.")
        evidence["data_jump"] = {"path": b.path, "line": b.line, "text": text,
                                 "leaves": jump.leaves, "loop_line": jump.loop.line}
        hint = (f"`{text}` at {paths.short_path(b.path)}:{b.line} is decided by each rank's "
                f"own data. {HINT}")
    return Finding(
        kind=FindingKind.STEP_SKEW, severity=Severity.WARNING, title=title,
        detail="\n".join(line for line in lines if line), ranks=tuple(culprits), hint=hint,
        group=first.group, seq=seq, op=op, evidence=evidence,
        time_ns=max(e.t_enter_ns for e in first.first.values()),
        **call_fields(first.first.get(r_high, any_call)),
    )


def _by_steps(skipped: dict[int, tuple[int, ...]]) -> list[tuple[tuple[int, ...], list[int]]]:
    """The ranks that skipped the same steps, together."""
    out: dict[tuple[int, ...], list[int]] = defaultdict(list)
    for r, steps in sorted(skipped.items()):
        out[steps].append(r)
    return sorted(out.items(), key=lambda item: item[1])


def _times(n: int) -> str:
    return "once" if n == 1 else f"{n} times"


def _jump(traces: TraceSet, e: Event):
    """The data-driven jump before ``e`` in the loop holding it (user frames only)."""
    frames = tuple(f for f in e.frames if paths.is_user_file(f.path))
    if not frames:
        return None
    try:
        found = data_jumps(frames, sources_for(traces))
    except Exception:  # the source is input: the finding stands without its reason
        return None
    return found[0] if found else None
