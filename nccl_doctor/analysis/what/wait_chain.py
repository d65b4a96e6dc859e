"""Wait chains across groups (pure): a rank waits in a call of one group for a rank that itself
waits in a call of another group, and so on, to the ranks that wait for no one - stuck in
their own code, exited, or waiting in a call nobody can answer. The ranks at the chain's end
are the ones to look at; the groups on the way are where the others hold.

Read from the findings: a ``missing_collective`` says which ranks wait in its call
(``waiting_ranks``) for which (its absent ranks); the sides of a ``collective_mismatch`` each
wait in it for the others; a short point-to-point channel (``p2p_mismatch``, count) says which
end waits for the other. A rank waits in one call at a time, so the links form a graph of
out-degree one per call; a cycle (ranks that wait for each other in different groups) ends the
chain where it closes.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Mapping

from nccl_doctor.analysis.calls.align import blocked_event, last_leaf
from nccl_doctor.analysis.calls.wording import ranks_text
from nccl_doctor.analysis.who.ahead import further, progress
from nccl_doctor.analysis.who.blame import sources_for
from nccl_doctor.source.branch import loops
from nccl_doctor.source.source_text import Sources
from nccl_doctor.analysis.why.loop_counts import DIFFERENT_COUNTS
from nccl_doctor.diagnosis import Finding, FindingKind
from nccl_doctor.location import Location
from nccl_doctor.model import EventState, ExitKind, TraceSet

__all__ = ["Link", "behind", "leads_on", "not_yet", "wait_links", "with_wait_chains"]


@dataclass(frozen=True)
class Link:
    """A rank waiting in a call for other ranks (the finding that says so)."""
    rank: int
    waits_for: tuple[int, ...]
    finding: Finding
    op: str | None = None  # the rank's own call, where the sides' differ (a mismatch)

    def text(self, members: tuple[int, ...], role: str | None) -> str:
        f = self.finding
        group = role or f"group {f.group} [{', '.join(map(str, members))}]"
        return (f"rank {self.rank} waits in {self.op or f.op} #{f.seq} of {group} for "
                f"{ranks_text(list(self.waits_for))}")


def wait_links(findings: list[Finding]) -> dict[int, Link]:
    """rank -> the call it waits in and the ranks it waits for, from the findings."""
    out: dict[int, Link] = {}
    for f in findings:
        if f.kind is FindingKind.MISSING_COLLECTIVE:
            waiting = tuple(getattr(f.evidence, "waiting_ranks", ()) or ())
            absent = tuple(r for r in f.absent if r not in waiting)
            for r in waiting:
                if absent:
                    out.setdefault(r, Link(r, absent, f))
        elif f.kind is FindingKind.COLLECTIVE_MISMATCH:
            # every side waits in the call for the ranks of the other sides
            sides = [(tuple(s.get("ranks", ())), s.get("op"))
                     for s in getattr(f.evidence, "sides", ()) if isinstance(s, Mapping)]
            for side, op in sides:
                others = tuple(sorted({r for s, _ in sides if s is not side for r in s}))
                for r in side:
                    if others:
                        out.setdefault(r, Link(r, others, f, op))
        elif f.kind is FindingKind.P2P_MISMATCH and getattr(f.evidence, "aspect", "") == "count":
            ev = f.evidence
            ends = {ev.src, ev.dst} - {None}
            for r, state in ev.waiting.items():
                other = tuple(sorted(ends - {r}))
                if state == "waits" and other:
                    out.setdefault(r, Link(r, other, f))
    return out


def _follow(start: tuple[int, ...], links: Mapping[int, Link]) -> tuple[list[Link], list[int]]:
    """The links from ``start`` on, in order, and the ranks where the chain ends."""
    order: list[Link] = []
    ends: list[int] = []
    seen: set[int] = set()
    todo = list(start)
    while todo:
        r = todo.pop(0)
        if r in seen:
            continue
        seen.add(r)
        link = links.get(r)
        if link is None:
            ends.append(r)
            continue
        order.append(link)
        todo.extend(link.waits_for)
    return order, sorted(ends)


def leads_on(f: Finding, links: Mapping[int, Link]) -> bool:
    """Every rank ``f`` says is missing waits itself, in another group's call: ``f`` is a link
    of a chain, not its end (a cycle leads on everywhere: the caller keeps them all then)."""
    return (f.kind is FindingKind.MISSING_COLLECTIVE and bool(f.absent)
            and all(r in links and links[r].finding.group != f.group for r in f.absent))


def behind(f: Finding, traces: TraceSet, sources: Sources | None = None) -> bool:
    """Every rank ``f`` says is missing has not reached ``f``'s call yet - it is behind, not past
    it: it is blocked in another group's call having gone less far in its other groups than a
    rank waiting in ``f``'s call (``_lagging``), or in a call made earlier in the same function
    of the user's (its line before the call's, in the same file and function, and no loop
    holding the call holds that line too: a loop may have brought it round). Where the ranks wait for each
    other in a cycle, the finding whose absent ranks went past its call (and wait further on,
    a barrier after the loop) is the one that says where they parted; and no branch is blamed
    for keeping a rank from a call it has not reached."""
    if f.kind is not FindingKind.MISSING_COLLECTIVE or not f.absent:
        return False
    waiting = tuple(getattr(f.evidence, "waiting_ranks", ()) or ())
    if _lagging(f, waiting, traces):
        return True
    here = next((at for at in (_blocked_line(traces, r) for r in waiting) if at is not None),
                None)
    if here is None:
        return False
    for r in f.absent:
        there = _blocked_line(traces, r)
        if there is None or (there.path, there.function) != (here.path, here.function) \
                or there.line >= here.line:
            return False
    sources = sources if sources is not None else sources_for(traces)
    try:
        if sources.get(here.path).text is None:
            return False  # (a source not read - changed, no fingerprint: no claim)
        held = loops((here,), sources)
    except Exception:  # the source is input: unread, no claim
        return False
    return not any(loop.first_line <= _blocked_line(traces, r).line <= loop.last_line
                   for loop in held for r in f.absent)


def _lagging(f: Finding, waiting: tuple[int, ...], traces: TraceSet) -> bool:
    """Every absent rank of ``f`` is blocked in a call of another group having gone less far,
    in the groups it shares call sites with, than a waiting rank had before ``f``'s call
    (analysis/who/ahead.py): it lags behind - it has not reached the call, it did not skip it
    (a rank that skipped the call has gone further, or ended)."""
    at = next(((r, e) for r in waiting if (e := _blocked(traces, r)) is not None
               and e.group == f.group), None)
    if at is None:
        return False
    ahead = progress(traces.ranks[at[0]], at[1], f.group)
    for r in f.absent:
        e = _blocked(traces, r)
        if e is None or e.group == f.group:
            return False
        if not further(ahead, progress(traces.ranks[r], e, f.group)):
            return False
    return True


def _blocked(traces: TraceSet, rank: int):
    """The call ``rank`` is blocked in (or was, when nccl-doctor or the user stopped the job:
    the stop made the call fail)."""
    trace = traces.ranks.get(rank)
    if trace is None:
        return None
    blocked = blocked_event(trace)
    if blocked is None and trace.exit.kind is ExitKind.STOPPED:
        last = last_leaf(trace)
        blocked = last if last is not None and last.state is EventState.FAILED else None
    return blocked


def _blocked_line(traces: TraceSet, rank: int) -> Location | None:
    """The user's line of the call ``rank`` is blocked in (or was, when nccl-doctor or the user
    stopped the job: the stop made the call fail)."""
    blocked = _blocked(traces, rank)
    return blocked.callsite if blocked is not None else None


def with_wait_chains(findings: list[Finding], traces: TraceSet,
                     roles: Mapping[str, str] | None = None) -> list[Finding]:
    """Each finding on a chain of waits through at least two groups, or whose absent ranks end
    one, says the chain: from the ranks that wait farthest from its end, through its groups, to
    the ranks it ends at and where those are (``evidence.wait_chain``, and a line of its
    detail)."""
    links = wait_links(findings)
    if len({link.finding.group for link in links.values()}) < 2:
        return findings
    waited = {r for link in links.values() for r in link.waits_for}
    heads = sorted(r for r in links if r not in waited) or sorted(links)
    # each head's chain, those through two groups or more (read once for every finding)
    chains = [(order, ends) for order, ends in (_follow((head,), links) for head in heads)
              if len({link.finding.group for link in order}) >= 2]
    roles = roles or {}
    out = []
    for f in findings:
        if f.kind not in (FindingKind.MISSING_COLLECTIVE, FindingKind.P2P_MISMATCH):
            out.append(f)
            continue
        chain = _chain_through(f, chains)
        if chain is None:
            out.append(f)
            continue
        order, ends = chain
        said = [link.text(traces.group_members(link.finding.group),
                          roles.get(link.finding.group or "")) for link in order]
        where = [_where(r, findings) for r in ends]
        line = "Wait chain: " + "; ".join(said + (where or [
            "each waits for the next, in a cycle: no rank can go on (a deadlock)"])) + "."
        evidence = [{"rank": link.rank, "op": link.op or link.finding.op,
                     "group": link.finding.group,
                     "group_ranks": list(traces.group_members(link.finding.group)),
                     "seq": link.finding.seq, "waits_for": list(link.waits_for)}
                    for link in order]
        evidence += [{"rank": r, "ends": w} for r, w in zip(ends, where)]
        out.append(replace(f, detail=f"{f.detail}\n{line}",
                           evidence=replace(f.evidence, wait_chain=tuple(evidence))))
    return not_yet(out)


def not_yet(findings: list[Finding]) -> list[Finding]:
    """A missing collective whose absent ranks have not come *yet* - each waits in another
    group's call, or a live hang's stacks showed it stuck in its own code (analysis/what/
    hang.py, ``evidence.stuck``) - says no loop ran a different number of times."""
    links = wait_links(findings)
    stuck = {int(r) for f in findings for r in (getattr(f.evidence, "stuck", None) or {})}
    out = []
    for f in findings:
        if (f.kind is not FindingKind.MISSING_COLLECTIVE or not f.absent
                or not all(r in links or r in stuck for r in f.absent)
                or DIFFERENT_COUNTS not in f.detail):
            out.append(f)
            continue
        detail = "\n".join(x for x in f.detail.splitlines() if DIFFERENT_COUNTS not in x)
        ev = replace(f.evidence, loop=None) if hasattr(f.evidence, "loop") else f.evidence
        branch = None if f.branch is not None and f.branch.kind in ("for", "while") else f.branch
        out.append(replace(f, detail=detail, evidence=ev, branch=branch))
    return out


def _chain_through(f: Finding, chains: list[tuple[list[Link], list[int]]],
                   ) -> tuple[list[Link], list[int]] | None:
    """Of ``chains`` (through two groups or more), the one that passes through ``f``'s call;
    else one that ends at ``f``'s absent ranks (the ranks held up, through other groups, by
    the ranks ``f`` says never came)."""
    through = [c for c in chains if any(link.finding is f for link in c[0])]
    ending = [c for c in chains if set(c[1]) & set(f.absent)]
    return (through or ending or [None])[0]


def _where(rank: int, findings: list[Finding]) -> str:
    """What the rank at a chain's end does, as the finding that misses it says it."""
    for f in findings:
        instead = getattr(f.evidence, "instead", None) or {}
        said = instead.get(str(rank)) if isinstance(instead, Mapping) else None
        if isinstance(said, Mapping) and said.get("detail"):
            return str(said["detail"])
        stuck = getattr(f.evidence, "stuck", None) or {}
        if rank in stuck:
            return f"rank {rank} {stuck[rank]}"
    return f"rank {rank} waits for no one"
