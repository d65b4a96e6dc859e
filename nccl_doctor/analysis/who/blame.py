"""Who is wrong, and why: the branch on the rank that split the ranks settles a desync's culprit.

A ``collective_mismatch`` or ``missing_collective`` has sides: the ranks in one call, and the
ranks in another (or elsewhere: blocked in another group, exited). Each side's frames are read
(source/branch.py, through the report's ``Sources``): the library frames from torch out to the
line that issued the call (call_path.py), and every frame of the user's. A rank-dependent
condition around a side's call that the other side's frames do not share says that side took a
branch the others did not: it made a call they never make, and it is the culprit. A
rank-dependent jump (``continue``, ``return``) before a side's call says the *other* side took
it and skipped that call. When both sides or neither took one, the pass's own rule stands
(majority, the side that skipped, else the lowest rank's convention) and the finding says so;
a loop the sides left at different times is named with the calls each rank made inside it
(analysis/why/loop_counts.py).

Pure apart from reading the sources the ranks fingerprinted (a file changed since the run is
"not analysed", never guessed at).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import replace
from typing import Any, Sequence

from nccl_doctor import call_path, paths, redact, words
from nccl_doctor.analysis.calls.align import blocked_event, last_leaf, timelines
from nccl_doctor.analysis.who.ahead import ahead_side
from nccl_doctor.source.branch import Branch, NotAnalysed, branches, data_jumps
from nccl_doctor.analysis.why.data_jumps import data_skip
from nccl_doctor.analysis.calls.ends import aborted_at_its_end
from nccl_doctor.analysis.why.loop_counts import Side, loop_line
from nccl_doctor.source.polarity import body_is_special
from nccl_doctor.source.source_text import Sources
from nccl_doctor.analysis.calls.wording import ranks_text, site
from nccl_doctor.diagnosis import Finding, FindingKind
from nccl_doctor.location import Location
from nccl_doctor.model import Event, EventKind, TraceSet

__all__ = ["settle", "sources_for", "Side"]

_KINDS = (FindingKind.COLLECTIVE_MISMATCH, FindingKind.MISSING_COLLECTIVE)
_MAX_USER_FRAMES = 8  # a side's user frames read (innermost first)


def sources_for(traces: TraceSet) -> Sources:
    """The report's sources: each file checked against the fingerprint a rank recorded."""
    digests: dict[str, str] = {}
    for _, trace in sorted(traces.ranks.items()):
        for path, digest in trace.meta.sources.items():
            digests.setdefault(path, digest)
    return Sources(digests)


def settle(findings: list[Finding], traces: TraceSet, sources: Sources | None = None,
           ) -> list[Finding]:
    """``findings`` with each desync's sides read for the branch on the rank."""
    if not any(f.kind in _KINDS for f in findings):
        return findings
    sources = sources if sources is not None else sources_for(traces)
    return [_settled(f, traces, sources) if f.kind in _KINDS else f for f in findings]


# -- the sides ---------------------------------------------------------------------------------

def read_frames(path: Sequence[Location], site_: Location | None) -> tuple[Location, ...]:
    """The frames of a call path whose source says why the call was made: the library frames
    from torch out to the issuing line, then the user's frames (and the user's line, when the
    path was cut before it)."""
    issuing = call_path.issuing(path, site_)
    out: list[Location] = []
    through = issuing is not None and any(loc == issuing for loc in path)
    users = 0
    for loc in path:
        user = paths.is_user_file(loc.path)
        if through or user:
            if user:
                users += 1
                if users > _MAX_USER_FRAMES:
                    break
            out.append(loc)
        if through and loc == issuing:
            through = False
    if site_ is not None and site_ not in out:
        out.append(site_)
    return tuple(out)


def _event_frames(e: Event | None, stack_frames: tuple[Location, ...]) -> tuple[
        tuple[Location, ...], Location | None]:
    """(frames to read, the user's line) of a call, or of a rank's stack when the call has no
    Python frames (a call issued from C++ with no stack recorded; a rank outside any call)."""
    if e is not None and (e.path or e.callsite):
        frames = read_frames(e.path, e.callsite)
        if not e.done and e.callsite is not None:  # the rank is in it: its stack goes on out
            frames += _outer_user_frames(stack_frames, e.callsite, frames)
        return frames, e.callsite or e.api_callsite
    frames = tuple(f for f in stack_frames if not paths.is_internal_file(f.path)
                   and not paths.is_doctor_file(f.path))
    user = next((f for f in frames if paths.is_user_file(f.path)), None)
    if not frames:
        return (), None
    if user is None:
        return frames[:1], None
    return read_frames(frames[:frames.index(user) + 1], user), user


def _outer_user_frames(stack: tuple[Location, ...], site_: Location,
                       have: tuple[Location, ...]) -> tuple[Location, ...]:
    """The user's frames of a rank's stack outside ``site_`` (the recorder keeps a call's path
    out to the innermost user frame; ``if rank == 0: evaluate(model)`` is a frame further
    out), when the stack is in that call."""
    at = next((i for i, f in enumerate(stack) if (f.path, f.line) == (site_.path, site_.line)),
              None)
    if at is None:
        return ()
    seen = {(f.path, f.line) for f in have}
    outer = [f for f in stack[at + 1:] if paths.is_user_file(f.path)
             and (f.path, f.line) not in seen]
    return tuple(outer[:_MAX_USER_FRAMES])


def _stack(traces: TraceSet, rank: int) -> tuple[Location, ...]:
    stack = traces.stacks.get(rank)
    thread = stack.thread if stack is not None else None
    return thread.frames if thread is not None else ()


def _call_at(traces: TraceSet, rank: int, group: str | None, seq: int | None) -> Event | None:
    trace = traces.ranks.get(rank)
    if trace is None or group is None or seq is None:
        return None
    return next((e for e in reversed(trace.events) if e.group == group and e.align_seq == seq
                 and e.kind in (EventKind.COLLECTIVE, EventKind.P2P)), None)


def _elsewhere(traces: TraceSet, rank: int) -> Event | None:
    """What a rank missing from a collective is in instead: the call it is blocked in, else
    its last call (a rank that went on and ended)."""
    trace = traces.ranks.get(rank)
    if trace is None:
        return None
    return blocked_event(trace) or last_leaf(trace)


def _sides(f: Finding, traces: TraceSet) -> list[Side]:
    out = []
    if f.kind is FindingKind.COLLECTIVE_MISMATCH:
        for side in f.evidence.get("sides") or ():
            ranks = tuple(int(r) for r in side.get("ranks") or ())
            if not ranks:
                continue
            e = _call_at(traces, ranks[0], f.group, f.seq)
            frames, yours = _event_frames(e, _stack(traces, ranks[0]))
            out.append(Side(ranks, frames, yours))
        return out
    waiting = tuple(int(r) for r in f.evidence.get("waiting_ranks") or ())
    if waiting:
        e = _call_at(traces, waiting[0], f.group, f.seq)
        frames, yours = _event_frames(e, _stack(traces, waiting[0]))
        out.append(Side(waiting, frames, yours))
    # the missing ranks, grouped by where they are instead
    by_place: dict[tuple[tuple[Location, ...], Location | None], list[int]] = {}
    for r in f.ranks:
        by_place.setdefault(_event_frames(_elsewhere(traces, r), _stack(traces, r)), []).append(r)
    for (frames, yours), ranks in by_place.items():
        out.append(Side(tuple(ranks), frames, yours))
    return out


# -- deciding ----------------------------------------------------------------------------------

#: the kinds whose text is an ``if``/``elif``/``while`` header (the others' is the line of the
#: test: a conditional expression, a comprehension's filter, a match, a decorator)
_HEADED = ("if", "else", "while", "jump")


def _key(b: Branch) -> tuple[str, int, str]:
    return b.path, b.line, b.kind


def _skipping(b: Branch) -> bool:
    """A branch whose special path (source/polarity.py) the ranks *outside* this call took,
    which kept them from it: a jump before it (``if rank == 1 and step == 2: continue``), the
    ``if`` arm of the ``else`` it is in (``if rank == skipper: pass`` / ``else:
    dist.broadcast(t)``), or an ``if`` that leaves them out (``if rank != skipper:
    dist.broadcast(t)``). Otherwise this side took the special path itself."""
    special = body_is_special(b.text, b.names) if b.kind in _HEADED else None
    special = True if special is None else special
    if b.skips or b.kind == "else":
        return special
    return not special


def _ahead(f: Finding, sides: list[Side], found: list[tuple[Branch, ...]],
           ahead: tuple[int, dict], traces: TraceSet, sources: Sources, lines: list[str],
           why: str, evidence: dict[str, Any]) -> Finding:
    """A mismatch whose sides are a pass apart (analysis/who/ahead.py): the side ahead left its
    pass early; the jump before the behind side's call, in the loop they share, is why - a
    branch on the rank (its culprit), or one the data decided."""
    i, more = ahead
    culprit = tuple(sorted(sides[i].ranks))
    behind = [j for j in range(len(sides)) if j != i]
    others = sorted(r for j in behind for r in sides[j].ranks)
    lead = "; ".join(f"the {op} at {paths.short_path(p)}:{line}, {n} call{'s' if n != 1 else ''}"
                     " further" for (p, line, op), n in sorted(more.items())[:3])
    said = (f"{ranks_text(list(culprit))} {words.verb(culprit, 'is')} a pass ahead of "
            f"{ranks_text(others)}: before this call {words.pick(culprit, 'it', 'they')} "
            f"had gone further in {words.pick(culprit, 'its', 'their')} other groups ({lead}) "
            f"- {words.pick(culprit, 'it', 'they')} left the pass {ranks_text(others)} "
            f"{words.verb(others, 'is')} in before this call.")
    evidence["ahead"] = {"ranks": list(culprit), "more": [
        {"path": p, "line": line, "op": op, "calls": n} for (p, line, op), n in
        sorted(more.items())]}
    jump = next((b for j in behind for b in found[j] if b.kind == "jump" and _skipping(b)),
                None)
    if jump is not None:
        evidence["blame"] = "branch"
        lines = _replace_why(lines, why, said + " " + _reason(jump, culprit, others))
        return replace(f, ranks=culprit, detail="\n".join(lines),
                       branch=_branch_json(jump, culprit, culprit=True), hint=_hint(jump),
                       evidence=evidence, **_culprit_call(f, sides[i]))
    evidence["blame"] = "ahead"
    for j in behind:
        frames = tuple(x for x in sides[j].frames if paths.is_user_file(x.path))
        data = data_jumps(frames, sources)[:1] if frames else ()
        for d in data:
            b = d.branch
            text = redact.source_line(b.text)
            evidence["data_jump"] = {"path": b.path, "line": b.line, "text": text,
                                     "leaves": d.leaves, "ranks": list(culprit),
                                     "call_line": b.frame.line, "loop_line": d.loop.line}
            where = f"{paths.short_path(b.path)}:{b.line}"
            lines = _replace_why(lines, why, said + f" {ranks_text(list(culprit))} took the "
                                 f"`{d.leaves}` at {where} (`{text}`) before the call "
                                 f"{ranks_text(others)} {words.verb(others, 'is')} in. The "
                                 f"condition at {where} differs per rank because of the data, "
                                 "not the rank number.")
            return replace(f, ranks=culprit, detail="\n".join(lines), evidence=evidence,
                           branch=_branch_json(b, culprit), **_culprit_call(f, sides[i]))
    lines = _replace_why(lines, why, said)
    return replace(f, ranks=culprit, detail="\n".join(lines), evidence=evidence,
                   **_culprit_call(f, sides[i]))


def _settled(f: Finding, traces: TraceSet, sources: Sources) -> Finding:
    sides = _sides(f, traces)
    if len(sides) < 2:
        return f
    found: list[tuple[Branch, ...]] = []
    failed: dict[str, NotAnalysed] = {}
    for side in sides:
        got, bad = branches(side.frames, sources)
        found.append(got)
        for n in bad:
            failed.setdefault(n.path, n)
    counts = Counter(_key(b) for got in found for b in set(got))
    # a condition every side is under (an outer frame they share) splits nobody
    own = [[b for b in got if counts[_key(b)] == 1] for got in found]
    blamed: dict[int, Branch] = {}  # side index -> the branch that puts it in the wrong
    for i, got in enumerate(own):
        took = next((b for b in got if not _skipping(b)), None)
        if took is not None:
            blamed.setdefault(i, took)
        # (a missing call's absent ranks are elsewhere: a jump before *their* call skips
        # nothing of this one - only the sides in the call are read for it)
        in_call = f.kind is FindingKind.COLLECTIVE_MISMATCH or i == 0
        jump = next((b for b in got if _skipping(b)), None) if in_call else None
        if jump is not None:  # the others took it, and skipped the call this side is in
            for j in range(len(sides)):
                if j != i:
                    blamed.setdefault(j, jump)
    evidence: dict[str, Any] = dict(f.evidence)
    evidence["branches"] = [_branch_json(b, sides[i].ranks) for i, got in enumerate(own)
                            for b in got]
    if failed:
        evidence["not_analysed"] = [{"path": n.path, "why": n.why} for n in failed.values()]
    evidence = _with_your_lines(f, evidence, sides, sources)
    lines = f.detail.split("\n")
    why = str(f.evidence.get("why") or "")
    lines = _replace_why(lines, why, [*_said_yours(sides, traces, sources), why] if why else
                         _said_yours(sides, traces, sources))
    crashed = _crashed(f, traces)
    if len(blamed) == 1 and crashed:
        # the ranks away from the call ended abnormally: their end (its own finding) comes
        # first; the branch is named, it does not make the others the culprits
        (i, branch), = blamed.items()
        lines.append(f"{ranks_text(list(sides[i].ranks))} made this call inside the "
                     f"rank-dependent branch at {_where(branch)} ({_quote(branch)}); "
                     f"{ranks_text(list(crashed))} ended abnormally before making it.")
        evidence["blame"] = "missing"
        return replace(f, detail="\n".join(lines), evidence=evidence,
                       branch=_branch_json(branch, sides[i].ranks))
    if len(blamed) == 1:
        (i, branch), = blamed.items()
        culprit = sides[i].ranks
        others = sorted(r for j, s in enumerate(sides) if j != i for r in s.ranks)
        reason = _reason(branch, sides[i].ranks, others)
        evidence["blame"] = "branch"
        lines = _replace_why(lines, why, reason)
        return replace(f, ranks=tuple(sorted(culprit)), detail="\n".join(lines),
                       branch=_branch_json(branch, sides[i].ranks, culprit=True),
                       hint=_hint(branch), evidence=evidence, **_culprit_call(f, sides[i]))
    if len(blamed) > 1:
        named = "; ".join(f"{ranks_text(list(sides[i].ranks))} at {_where(b)}"
                          for i, b in sorted(blamed.items()))
        lines = _replace_why(lines, why, why + " Both sides took a rank-dependent branch ("
                             + named + "): the fault may lie on either side.")
        evidence["blame"] = "both_branched"
        first = min(blamed.items())[1]
        return replace(f, detail="\n".join(lines), evidence=evidence,
                       branch=_branch_json(first, sides[min(blamed)].ranks))
    ahead = None if crashed or blamed else ahead_side(f, sides, traces)
    if ahead is not None:  # the same line on every side, a pass apart
        return _ahead(f, sides, found, ahead, traces, sources, lines, why, evidence)
    jumped = None if crashed or _unseen_in(f, traces) else _shared_jump(
        found, counts, len(sides), f)
    if jumped is not None:
        branch, culprit = jumped
        others = sorted(r for s in sides for r in s.ranks if r not in culprit)
        evidence["blame"] = "branch"
        lines = _replace_why(lines, why, _reason(branch, culprit, others))
        return replace(f, ranks=culprit, detail="\n".join(lines),
                       branch=_branch_json(branch, culprit, culprit=True),
                       hint=_hint(branch), evidence=evidence)
    skip = None if crashed else data_skip(sides, traces, sources)
    if skip is not None:
        # a jump the data decided, not the rank: named with the ranks that took it; who is
        # wrong stays the pass's own rule (the data, not a side's code, parted them)
        evidence["data_jump"] = skip.to_json()
        lines.append(skip.text())
        return replace(f, detail="\n".join(lines), evidence=evidence, hint=skip.hint(),
                       branch=_branch_json(skip.jump.branch, skip.took))
    extra = loop_line(sides, traces, sources)
    if extra is not None:
        text, loop_json = extra
        evidence["loop"] = loop_json
        lines.append(text)
    elif failed:
        lines.append("No branch on the rank was read: "
                     + "; ".join(f"{paths.short_path(n.path)}: {n.why}"
                                 for n in list(failed.values())[:3]) + ".")
    else:
        lines.append("No branch on the rank was found on either side's path.")
    return replace(f, detail="\n".join(lines), evidence=evidence)


def _unseen_in(f: Finding, traces: TraceSet) -> bool:
    """Some rank made calls in the finding's group that nothing recorded: its counts are not
    the whole story, and never make a culprit."""
    line = timelines(traces).get(f.group) if f.group is not None else None
    return bool(line is not None and line.unseen)


def _shared_jump(found: list[tuple[Branch, ...]], counts: Counter, n_sides: int,
                 f: Finding) -> tuple[Branch, tuple[int, ...]] | None:
    """Every side of a missing collective is past the same rank-dependent jump (``if rank == 1
    and step == 2: continue``), in the loop or function they share: the ranks that made fewer
    calls in the group - the absent ones - took it, when the jump singles out the ranks that
    take it (source/polarity.py). (The branch, the culprits) or None."""
    if f.kind is not FindingKind.MISSING_COLLECTIVE or not found:
        return None
    culprit = tuple(sorted(f.absent or f.ranks))
    if not culprit:
        return None
    for b in found[0]:
        if b.kind == "jump" and b.skips and counts[_key(b)] == n_sides and _skipping(b):
            return b, culprit
    return None


def _crashed(f: Finding, traces: TraceSet) -> tuple[int, ...]:
    """A missing_collective's absent ranks when every one of them ended abnormally (raised,
    was signalled, vanished, was lost); () otherwise. An abort at teardown (a signal with no
    exception and no Python frame, after its last call completed: gloo's threads at exit) is
    no crash of its own: a rank that skipped the call and went on to its end aborts so when a
    peer is still in the call."""
    if f.kind is not FindingKind.MISSING_COLLECTIVE:
        return ()
    absent = [r for r in f.absent if r in traces.ranks]
    if absent and all(traces.ranks[r].exit.abnormal and not aborted_at_its_end(traces.ranks[r])
                      for r in absent):
        return tuple(absent)
    return ()


def _replace_why(lines: list[str], why: str, text: str | list[str]) -> list[str]:
    """``lines`` with the pass's account of who is wrong (``why``) replaced by ``text``."""
    new = [text] if isinstance(text, str) else text
    if why and why in lines:
        at = lines.index(why)
        return lines[:at] + new + lines[at + 1:]
    return lines + new


def _said_yours(sides: list[Side], traces: TraceSet, sources: Sources) -> list[str]:
    """Each side's line of the user's, with its code: under a framework, the library frame it
    is in and the user's line that led there ("in lightning 2.6.6's
    _TrainingEpochLoop._broadcast_sigterm_tensor, from your train.py:36 `trainer.fit(...)`")."""
    out = []
    for side in sides:
        if side.your_line is None:
            continue
        code = source_text(_line_text(sources, side.your_line))
        quoted = f" `{code}`" if code else ""
        if side.frames and paths.is_library_file(side.frames[0].path):  # a library made it
            first = side.frames[0]
            issuing = call_path.issuing(side.frames, side.your_line) or first
            where = issuing if paths.is_library_file(issuing.path) else first
            package = paths.package_of(where.path)
            trace = traces.ranks.get(side.ranks[0])
            version = trace.meta.versions.get(package) if trace and package else None
            owner = f"{package} {version}" if version else (package or "library code")
            out.append(f"{ranks_text(list(side.ranks))}: in {owner}'s "
                       f"{where.function or '?'} ({paths.short_path(where.path)}:{where.line}), "
                       f"from {paths.owner(side.your_line.path)} {site(side.your_line)}"
                       f"{quoted}")
        else:
            out.append(f"{ranks_text(list(side.ranks))}: {paths.owner(side.your_line.path)} "
                       f"{site(side.your_line)}{quoted}")
    return out


def _reason(b: Branch, culprit: Sequence[int], others: Sequence[int]) -> str:
    who, rest = ranks_text(list(culprit)), ranks_text(list(others))
    took, are = words.verb(culprit, "takes"), words.verb(culprit, "is")
    if _skipping(b):
        what = "jump" if b.skips else "branch"
        return (f"{who} {took} the rank-dependent {what} at {_where(b)} ({_quote(b)}) that "
                f"skips the call {rest} made: {who} {are} the odd side." + _via(b))
    inside = "inside" if b.kind != "decorator" else "under the decorator"
    return (f"{who} made this call {inside} the rank-dependent branch at {_where(b)} "
            f"({_quote(b)}), which {rest} did not take: {who} {are} the odd side." + _via(b))


def _via(b: Branch) -> str:
    """How a test that reads the rank from another function does (source/rank_flow.py):
    " It depends on the rank through another function: `is_main` is `rank == 0`, passed at
    train.py:31." ("" for a test that names the rank itself)."""
    if not b.via:
        return ""
    return (" It depends on the rank through another function: "
            + "; ".join(source_text(v) for v in b.via) + ".")


def _hint(b: Branch) -> str:
    """The fix, for the branch that split the ranks."""
    if _skipping(b):
        return (f"{_quote(b)} at {_where(b)} skips a collective on the ranks that take it while "
                "the others make it: every rank must make the same collectives in the same "
                "order. Make the collective on every rank (before the branch), or skip it on "
                "every rank alike.")
    return (f"The collective under {_quote(b)} at {_where(b)} runs only on the ranks where it "
            "holds, and the others never make it: every rank must make the same collectives "
            "in the same order. Move the collective (or the library call that makes one) out "
            "of the branch so that every rank makes it, and keep only rank-local work (saving, "
            "logging, printing) inside.")


def _where(b: Branch) -> str:
    return f"{paths.short_path(b.path)}:{b.line}"


def _quote(b: Branch) -> str:
    text = source_text(b.text)
    return f"`{text}`" + (", whose else branch the others are in" if b.kind == "else" else "")


def source_text(text: str) -> str:
    """A line of the user's source as reports show it: secrets masked (redact.source_line)."""
    return redact.source_line(text)


def _branch_json(b: Branch, ranks: Sequence[int], culprit: bool = False) -> dict[str, Any]:
    """The branch as reports keep it. ``ranks``: the side it was read on; for the culprit's
    branch, the culprits, and ``skips`` true when its special path kept them out of the call
    the others made (a jump they took, the ``if`` whose else the others are in, an ``if`` that
    leaves them out)."""
    package = paths.package_of(b.path) if paths.is_library_file(b.path) else None
    skips = _skipping(b) if culprit else b.skips
    return {"path": b.path, "line": b.line, "text": source_text(b.text), "kind": b.kind,
            "function": b.function, "ranks": sorted(ranks), "skips": skips,
            "library": package, "names": list(b.names),
            **({"via": [source_text(v) for v in b.via]} if b.via else {}),
            **({"culprit": True} if culprit else {})}


def _culprit_call(f: Finding, side: Side) -> dict[str, Any]:
    """A mismatch names the odd side's call: the culprit's, once the branch chose it."""
    if f.kind is not FindingKind.COLLECTIVE_MISMATCH:
        return {}
    for s in f.evidence.get("sides") or ():
        if tuple(s.get("ranks") or ()) == side.ranks:
            return {"op": s.get("op") or f.op, "call_path": tuple(s.get("call_path") or ()),
                    "callsite": _plain(s.get("issuing")), "entry_callsite": _plain(s.get("entry"))}
    return {}


def _plain(value: Any) -> str | None:
    return str(value) if value else None


def _with_your_lines(f: Finding, evidence: dict[str, Any], sides: list[Side],
                     sources: Sources) -> dict[str, Any]:
    """Each side's user line (``your_line``) and its source text (``your_code``), where it
    is readable: under a framework that calls the user back, the callback's line."""
    def lines(side: Side) -> dict[str, Any]:
        if side.your_line is None:
            return {"your_line": None}
        return {"your_line": site(side.your_line),
                "your_code": source_text(_line_text(sources, side.your_line))}

    if f.kind is FindingKind.COLLECTIVE_MISMATCH:
        by_ranks = {s.ranks: s for s in sides}
        evidence["sides"] = [
            {**s, **lines(by_ranks[tuple(s["ranks"])])} if tuple(s.get("ranks") or ())
            in by_ranks else s for s in evidence.get("sides") or ()]
        return evidence
    waiting, *missing = sides
    evidence.update(lines(waiting))
    instead = dict(evidence.get("instead") or {})
    for side in missing:
        for r in side.ranks:
            if str(r) in instead:
                instead[str(r)] = {**instead[str(r)], **lines(side),
                                   "call_path": [loc.to_json() for loc in side.frames]}
    evidence["instead"] = instead
    return evidence


def _line_text(sources: Sources, loc: Location) -> str:
    got = sources.get(loc.path)
    if got.text is None:
        return ""
    lines = sources.lines(loc.path)
    return lines[loc.line - 1].strip()[:160] if 0 < loc.line <= len(lines) else ""
