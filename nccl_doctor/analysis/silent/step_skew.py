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
the first call on. A capture that lost its first records (a lapped ring, a large job's window,
the newest records the supervisor reads of a long run) is read from its newest unbroken run of
records, its marker calls numbered from their sequence numbers in their group, which must step
by one amount on every rank (else nothing is said): the first skewed call read is then not
necessarily the first made.

The reason, when the source shows one: the data-driven jump before the call in the loop that
holds it (source/branch.py ``data_jumps``), with the ranks that skipped a step.
"""

from __future__ import annotations

from bisect import bisect_left
from collections import defaultdict
from dataclasses import dataclass
from typing import Any

from nccl_doctor import paths
from nccl_doctor.analysis.calls.align import leaf_collectives
from nccl_doctor.analysis.calls.wording import call_fields, ranks_text, site_key
from nccl_doctor.analysis.who.blame import sources_for
from nccl_doctor.source.branch import Branch, DataJump, branches, data_jumps
from nccl_doctor.diagnosis import Finding, FindingKind, Severity
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


@dataclass(frozen=True)
class _Marker:
    site: _Site
    per_pass: int  # marker calls a pass of the loop makes
    idx: dict[int, list[int]]  # rank -> its marker calls' record numbers, in order
    ordinal: dict[int, list[int]]  # rank -> each marker call's number among them (1-based)

    def step(self, rank: int, e: Event) -> int | None:
        """The pass of the loop ``e`` was made in (1-based): the marker calls before it (None:
        no marker call before it was read)."""
        at = bisect_left(self.idx[rank], e.idx)
        return self.ordinal[rank][at - 1] // self.per_pass if at else None


@dataclass(frozen=True)
class _Skew:
    group: str
    first: dict[int, Event]  # rank -> its call of the first aligned call whose steps differ
    steps: dict[int, int]  # rank -> that call's step
    skipped: dict[int, tuple[int, ...]]  # rank -> the steps it made no call of the site in
    pairs: int  # aligned calls of the group whose steps differ
    marker: _Marker


_BySite = dict[int, dict[tuple[_Site, str], list[Event]]]


def detect_step_skew(traces: TraceSet) -> list[Finding]:
    by_site, cut = _calls_by_site(traces)
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
            marker = _marker(by_site, site, name, members, cut)
            if marker is not None:
                skew = _skew(by_site, site, name, members, marker, cut)
                if skew is not None:
                    skews[site].append(skew)
    return [_finding(traces, site, found, cut) for site, found in sorted(skews.items())]


def _skew(by_site: _BySite, site: _Site, group: str, members: tuple[int, ...],
          marker: _Marker, cut: set[int]) -> _Skew | None:
    """The first call of ``site`` in ``group`` that every member made (and returned from) whose
    steps differ, with how many do; None when every such call pairs the same step."""
    calls = {r: [e for e in by_site[r][(site, group)] if e.state in _PAIRED] for r in members}
    seqs = {r: [e.align_seq for e in calls[r]] for r in members}
    if any(seqs[r] != seqs[members[0]] for r in members):  # (a window, a rank behind)
        common = set.intersection(*(set(v) for v in seqs.values()))
        calls = {r: [e for e in calls[r] if e.align_seq in common] for r in members}
    steps_of = {r: [marker.step(r, e) for e in calls[r]] for r in members}
    if cut & set(members):  # (calls with no marker read before them are left out)
        unknown = {e.align_seq for r in members for e, s in zip(calls[r], steps_of[r])
                   if s is None}
        keep = {r: [i for i, e in enumerate(calls[r]) if e.align_seq not in unknown]
                for r in members}
        calls = {r: [calls[r][i] for i in keep[r]] for r in members}
        steps_of = {r: [steps_of[r][i] for i in keep[r]] for r in members}
    steps = [steps_of[r] for r in members]
    parted = [i for i, at in enumerate(zip(*steps)) if min(at) != max(at)]
    if not parted:
        return None
    i = parted[0]
    return _Skew(group, {r: calls[r][i] for r in members},
                 {r: steps[k][i] for k, r in enumerate(members)},
                 _skipped(by_site, site, group, marker, members, cut), len(parted), marker)


def _calls_by_site(traces: TraceSet) -> tuple[_BySite, set[int]]:
    """rank -> (site, group) -> its calls there, in order; and the ranks whose capture lost its
    first records (a lapped ring, a window of a large job, the newest records of a long run the
    supervisor looks at): of those only the newest unbroken run of records is read."""
    out: _BySite = {}
    cut: set[int] = set()
    for rank, trace in traces.ranks.items():
        events = trace.events
        if not events:
            continue
        leaves = leaf_collectives(trace)
        if events[0].idx != 1 or events[-1].idx != len(events):
            cut.add(rank)
            start = len(events) - 1
            while start > 0 and events[start - 1].idx == events[start].idx - 1:
                start -= 1
            leaves = [e for e in leaves if e.idx >= events[start].idx]
        calls: dict[tuple[_Site, str], list[Event]] = defaultdict(list)
        for e in leaves:
            site = site_key(e)
            if site is not None:
                calls[(site, e.group)].append(e)
        out[rank] = calls
    return out, cut


def _marker(by_site: _BySite, site: _Site, group: str, members: tuple[int, ...],
            cut: set[int]) -> _Marker | None:
    """A call site of the same file that every member makes on every pass of the loop, before
    ``site``'s call (see the module's docstring); None when none is."""
    own = {r: [e.idx for e in by_site[r].get((site, group), [])] for r in members}
    if any(not idx for idx in own.values()):
        return None
    candidates: dict[_Site, dict[int, list[Event]]] = defaultdict(dict)
    for r in members:
        per_site: dict[_Site, list[Event]] = defaultdict(list)
        for (other, _), events in by_site[r].items():
            if other != site and other[0] == site[0]:
                per_site[other].extend(events)
        for other, events in per_site.items():
            candidates[other][r] = sorted(events, key=lambda e: e.idx)
    shared = [(s, ev) for s, ev in candidates.items() if set(ev) == set(members)]
    shared.sort(key=lambda item: (-min(len(v) for v in item[1].values()), item[0]))
    for other, events in shared[:_MARKERS]:
        idx = {r: [e.idx for e in events[r]] for r in members}
        # (a rank read from the middle: its first interval is cut)
        counts = [c for r in members for c in _between(idx[r], own[r])[r in cut:]]
        if not counts:
            continue
        least = min(counts)
        if least < 1 or any(c % least for c in counts):
            continue
        ordinal = _ordinals(events, members, cut)
        if ordinal is not None:
            return _Marker(other, least, idx, ordinal)
    return None


def _ordinals(events: dict[int, list[Event]], members: tuple[int, ...], cut: set[int],
              ) -> dict[int, list[int]] | None:
    """Each marker call's number among the rank's marker calls. Counted when every member's
    calls were read from the start; else read from the calls' sequence numbers in their group,
    which must step by one amount on every rank and every pass (the group's calls a pass are
    the same): None when they do not."""
    if not cut & set(members):
        return {r: list(range(1, len(events[r]) + 1)) for r in members}
    steps = [b.align_seq - a.align_seq for r in members
             for a, b in zip(events[r], events[r][1:])]
    # (the run read is unbroken: every call of the group between two markers is in it)
    if not steps or min(steps) < 1 or len(set(steps)) != 1:
        return None
    d = steps[0]
    return {r: [(e.align_seq - 1) // d + 1 for e in events[r]] for r in members}


def _between(marks: list[int], calls: list[int]) -> list[int]:
    """How many ``marks`` come before the first of ``calls`` and between each two of them."""
    out, prev = [], 0
    for c in calls:
        at = bisect_left(marks, c)
        out.append(at - prev)
        prev = at
    return out


def _skipped(by_site: _BySite, site: _Site, group: str, marker: _Marker,
             members: tuple[int, ...], cut: set[int]) -> dict[int, tuple[int, ...]]:
    """rank -> the steps (1-based) it made no call of ``site`` in, up to its last call (from
    the first read, where its records were cut)."""
    out = {}
    for r in members:
        steps = [s for s in (marker.step(r, e) for e in by_site[r][(site, group)])
                 if s is not None]
        if not steps:
            continue
        made = set(steps)
        missing = tuple(s for s in range(min(steps) if r in cut else 1, max(steps))
                        if s not in made)
        if missing:
            out[r] = missing
    return out


def _finding(traces: TraceSet, site: _Site, skews: list[_Skew], cut: set[int]) -> Finding:
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
        f"{_times(first.marker.per_pass)} a pass."
        + (f" Read from the newest records of {ranks_text(sorted(cut & set(first.first)))} "
           "only (a long run's window): the steps are numbered from the sequence numbers of "
           f"the {mop}'s group, and #{seq} is the first such call read, not necessarily the "
           "first made." if cut & set(first.first) else ""),
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
    rank_branch, jump = _reason(traces, first.first[culprits[0]] if culprits[0] in first.first
                                else any_call)
    hint = HINT
    if rank_branch is not None:
        b = rank_branch
        text = source_line(b.text)
        lines.append(f"The branch on the rank at {paths.short_path(b.path)}:{b.line} (`{text}`) "
                     f"decides whether a rank makes the {op} in a pass.")
        evidence["branch"] = {"path": b.path, "line": b.line, "text": text, "kind": b.kind,
                              "names": list(b.names)}
        hint = (f"`{text}` at {paths.short_path(b.path)}:{b.line} lets some ranks leave out a "
                f"pass's {op}. {HINT}")
    elif jump is not None:
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


def _reason(traces: TraceSet, e: Event) -> tuple[Branch | None, DataJump | None]:
    """Why a rank leaves out the call ``e`` in a pass (user frames only): a branch on the rank
    enclosing or skipping it, else the data-driven jump before it in the loop holding it."""
    frames = tuple(f for f in e.frames if paths.is_user_file(f.path))
    if not frames:
        return None, None
    try:
        sources = sources_for(traces)
        found, _ = branches(frames, sources)
        if found:
            return found[0], None
        jumps = data_jumps(frames, sources)
    except Exception:  # the source is input: the finding stands without its reason
        return None, None
    return None, (jumps[0] if jumps else None)
