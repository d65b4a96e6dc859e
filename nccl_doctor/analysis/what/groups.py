"""Process groups made differently on different ranks (pure): ``group_mismatch``.

torch names a group made by ``new_group`` by how many groups the rank has made so far (unless
``use_local_synchronization=True``, which names it by a hash of its ranks), and every rank of
the world must call ``new_group`` for every group, members or not. A group made by its members
only, or groups made in another order, leave the same group with different names on different
ranks: its members register under different names and each waits inside ``new_group`` (or, on
NCCL, in the first collective, where the communicator forms) for peers that never come. No
collective is pending, and the collectives that do run are lined up under names that mean
other groups on other ranks.

The recorder notes each group-making call before it runs and once it returns
(nccl_doctor/rank/recorder/group_making.py); this pass lines up each rank's calls that take a
name, in order, and says where they part.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Mapping

from nccl_doctor.analysis.calls.wording import call_fields, site
from nccl_doctor.diagnosis import Finding, FindingKind, Severity
from nccl_doctor.model import Event, EventKind, EventState, RankTrace, TraceSet
from nccl_doctor.words import ranks_text, ranks_verb

HINT = (
    "Every rank must call new_group for every group, members or not, and in the same order: "
    "torch names a group by how many groups the rank has made, so a group made by some ranks "
    "only shifts the names of every group after it. Move the new_group call out of the "
    "rank-dependent branch (non-members simply do not use the group), or pass "
    "use_local_synchronization=True, with which only the members call it and its name comes "
    "from its ranks."
)


@dataclass(frozen=True)
class GroupCall:
    """One group-making call of one rank, as its notes say."""

    rank: int
    order: int  # the rank's n-th group-making call (nested ones included)
    op: str  # new_group, new_subgroups, split_group, ...
    asked: tuple[int, ...]  # the ranks asked for, sorted (the whole world for ranks=None)
    name: str  # the name torch gives the group on this rank ("" when not known)
    local: bool  # use_local_synchronization: named by its ranks, made by its members only
    answered: bool  # it came back (returned or raised); False: the rank is (or died) inside
    time_ns: int
    event: Event | None = None  # its record (where it was called), when the capture holds it

    @property
    def takes_a_name(self) -> bool:
        """Numbered by the rank's group count: the calls whose order must agree."""
        return self.op == "new_group" and not self.local

    def shown(self) -> str:
        return f"[{', '.join(str(r) for r in self.asked)}]"

    @property
    def where(self) -> str:
        e = self.event
        return site(e.callsite or e.api_callsite) if e is not None else "?"


def group_calls(trace: RankTrace, world_size: int) -> list[GroupCall]:
    """The rank's group-making calls in order, from its ``group_call``/``group_made`` notes."""
    by_idx = {e.idx: e for e in trace.events if e.kind is EventKind.GROUP}
    made: dict[int, Mapping] = {}
    calls: list[tuple[int, Mapping]] = []
    for note in trace.notes:
        order = note.get("order")
        if not isinstance(order, int):
            continue
        if note.get("note") == "group_call":
            calls.append((order, note))
        elif note.get("note") == "group_made":
            made[order] = note
    out = []
    for order, note in sorted(calls, key=lambda c: c[0]):
        raw = note.get("ranks")
        asked: tuple[int, ...]
        if isinstance(raw, list) and all(isinstance(r, int) for r in raw):
            asked = tuple(sorted(raw))
        else:
            asked = tuple(range(world_size))
        count, at = note.get("count"), note.get("time_ns")
        local = bool(note.get("local"))
        event = by_idx.get(note["idx"]) if isinstance(note.get("idx"), int) else None
        answered = order in made
        if not answered and event is not None and event.state is not EventState.ENTERED:
            answered = True  # (its made note was refused: the record says it came back)
        out.append(GroupCall(
            rank=trace.rank, order=order, op=str(note.get("op", "")), asked=asked,
            name=str(count) if isinstance(count, int) and not local else "",
            local=local, answered=answered, time_ns=at if isinstance(at, int) else 0,
            event=event))
    return out


def naming_sequences(traces: TraceSet) -> dict[int, list[GroupCall]]:
    """Per rank, its calls that take a name from its group count, in order."""
    return {r: [c for c in group_calls(t, traces.world_size) if c.takes_a_name]
            for r, t in sorted(traces.ranks.items())}


def detect_group_mismatch(traces: TraceSet) -> list[Finding]:
    """The first place where the ranks' group-making calls part: a group some ranks never made,
    or groups made in another order."""
    seqs = naming_sequences(traces)
    if len(seqs) < 2 or not any(seqs.values()):
        return []
    damaged = traces.damaged_ranks()
    seqs = {r: s for r, s in seqs.items() if r not in damaged}
    depth = max((len(s) for s in seqs.values()), default=0)
    latent: tuple[int, list[int]] | None = None
    for i in range(depth):
        at = {r: s[i] for r, s in seqs.items() if i < len(s)}
        asked = {c.asked for c in at.values()}
        if len(asked) > 1:
            return [_parted(traces, seqs, i, at)]
        ended = [r for r in seqs if r not in at]
        stuck = [c for c in at.values() if not c.answered]
        if ended and stuck and all(_moved_on(traces.ranks[r], seqs[r]) for r in ended):
            return [_never_made(traces, seqs, stuck, ended)]
        if ended and latent is None and all(_went_on_well(traces.ranks[r], seqs[r])
                                            for r in ended):
            latent = (i, ended)
    return [_unused(seqs, *latent)] if latent is not None else []


def _went_on_well(trace: RankTrace, seq: list[GroupCall]) -> bool:
    """The rank went on past its group-making calls and did not fail: what it did not make,
    it never will."""
    return (all(c.answered for c in seq) and _moved_on(trace, seq)
            and not trace.exit.abnormal)


def _unused(seqs: dict[int, list[GroupCall]], i: int, ended: list[int]) -> Finding:
    """Groups some ranks never made, though nothing waited for them (NCCL makes a group's
    communicator at its first collective, and these were never used): every group made after
    them is named differently on those ranks, so the first use of one will hang."""
    makers = sorted(r for r, s in seqs.items() if len(s) > i)
    witness = seqs[makers[0]][i]
    more = len(seqs[makers[0]]) - i - 1
    also = f" (and {more} more after it)" if more > 0 else ""
    title = (f"{ranks_text(ended)} never made process group {witness.shown()}{also}: "
             f"{ranks_text(makers)} made it at {witness.where}; nothing used it, but every "
             "group made after it is named differently on "
             f"{'that rank' if len(ended) == 1 else 'those ranks'}")
    lines = [f"{ranks_verb(ended, 'made')} {len(seqs[ended[0]])} group(s); "
             f"{ranks_verb(makers, 'made')} {len(seqs[makers[0]])}.",
             "The first collective on a group made after this one hangs: its members know it "
             "by different names."]
    found = _finding(title, lines, ended, witness,
                     {"aspect": "never_made", "group": list(witness.asked), "made_by": makers,
                      "waiting": []})
    return replace(found, severity=Severity.WARNING)


def _moved_on(trace: RankTrace, seq: list[GroupCall]) -> bool:
    """The rank will make no more groups here: it ended, or it is blocked in (or has made)
    a call after its last group-making one."""
    if not trace.exit.was_running:
        return True
    last = seq[-1].time_ns if seq else 0
    return any(e.t_enter_ns > last and e.kind in (EventKind.COLLECTIVE, EventKind.P2P)
               for e in trace.events[-8:])


def _parted(traces: TraceSet, seqs: dict[int, list[GroupCall]], i: int,
            at: dict[int, GroupCall]) -> Finding:
    """Ranks asked for different groups at their i-th group: who skipped which."""
    by_asked: dict[tuple[int, ...], list[int]] = {}
    for r, c in sorted(at.items()):
        by_asked.setdefault(c.asked, []).append(r)
    # A group one side made here that the other side never makes at all was skipped by it;
    # both made later: the order differs.
    skipped: list[tuple[tuple[int, ...], list[int], list[int]]] = []
    for group, makers in by_asked.items():
        others = [r for r in at if r not in makers]
        never = [r for r in others if all(c.asked != group for c in seqs[r])]
        # (a rank still inside another group may make this one yet: skipped when none of the
        # others made it and one of them is known to have gone on without it)
        known = [r for r in never if all(c.answered for c in seqs[r])
                 and _moved_on(traces.ranks[r], seqs[r])]
        if never and never == others and known:
            skipped.append((group, makers, never))
    names = _names_differ(seqs)
    if skipped:
        group, makers, never = max(skipped, key=lambda s: (len(s[1]), -min(s[1])))
        made = at[makers[0]]
        title = (f"{ranks_text(never)} never made process group {made.shown()}: "
                 f"{ranks_text(makers)} made it at {made.where}, so from then on the ranks name "
                 "their groups differently")
        culprits, witness = never, made
        evidence = {"aspect": "never_made", "group": list(group), "made_by": makers,
                    "waiting": sorted(r for r, c in at.items() if not c.answered)}
    else:
        (a, a_ranks), (b, b_ranks) = sorted(by_asked.items(), key=lambda kv: kv[1][0])[:2]
        first_a, first_b = at[a_ranks[0]], at[b_ranks[0]]
        title = (f"process groups made in a different order: {ranks_text(a_ranks)} made "
                 f"{first_a.shown()} at {first_a.where} where {ranks_text(b_ranks)} made "
                 f"{first_b.shown()} at {first_b.where}")
        culprits, witness = sorted(b_ranks), first_a
        evidence = {"aspect": "order", "group": list(a), "made_by": a_ranks,
                    "waiting": sorted(r for r, c in at.items() if not c.answered)}
    lines = [_rank_line(seqs[r], i) for r in sorted(at)]
    if names:
        lines.append(names)
    return _finding(title, lines, culprits, witness, evidence)


def _never_made(traces: TraceSet, seqs: dict[int, list[GroupCall]], stuck: list[GroupCall],
                ended: list[int]) -> Finding:
    """Ranks wait inside new_group for a group the others never made (they moved on)."""
    witness = min(stuck, key=lambda c: c.rank)
    waiting = sorted(c.rank for c in stuck)
    makers = sorted(r for r, s in seqs.items() if any(c.asked == witness.asked for c in s))
    title = (f"{ranks_text(sorted(ended))} never made process group {witness.shown()}: "
             f"{ranks_text(makers)} made it at {witness.where}, and "
             f"{ranks_verb(waiting, 'waits')} inside it")
    lines = [f"{ranks_verb(waiting, 'waits')} for every rank of the world to make group "
             f"{witness.shown()} (torch's name '{witness.name}')" if witness.name else
             f"{ranks_verb(waiting, 'waits')} in new_group({witness.shown()})"]
    for r in sorted(ended):
        trace = traces.ranks[r]
        went = ("ended" if not trace.exit.was_running
                else "went on to other calls")
        lines.append(f"rank {r} made {len(seqs[r])} group(s) and {went} without making it.")
    names = _names_differ(seqs)
    if names:
        lines.append(names)
    return _finding(title, lines, sorted(ended), witness,
                    {"aspect": "never_made", "group": list(witness.asked), "made_by": makers,
                     "waiting": waiting})


def _rank_line(seq: list[GroupCall], i: int) -> str:
    c = seq[i]
    state = "made" if c.answered else "waits inside"
    named = f" (its group '{c.name}')" if c.name else ""
    nxt = seq[i + 1] if i + 1 < len(seq) else None
    then = ""
    if nxt is not None:
        nstate = "made" if nxt.answered else "waits inside"
        nnamed = f" as '{nxt.name}'" if nxt.name else ""
        then = f", then {nstate} {nxt.shown()}{nnamed} at {nxt.where}"
    return f"rank {c.rank} {state} {c.shown()}{named} at {c.where}{then}."


def _names_differ(seqs: dict[int, list[GroupCall]]) -> str:
    """The first group whose members know it by different names: "group [0, 2] is '2' on
    rank 0 and '1' on rank 2"."""
    names: dict[tuple[int, ...], dict[int, tuple[str, int]]] = {}
    for r, seq in seqs.items():
        for c in seq:
            if c.name and r in c.asked:
                names.setdefault(c.asked, {}).setdefault(r, (c.name, c.time_ns))
    differing = [(min(t for _, t in by_rank.values()), group, by_rank)
                 for group, by_rank in names.items()
                 if len({n for n, _ in by_rank.values()}) > 1]
    if not differing:
        return _name_shared(seqs)
    _, group, by_rank = min(differing)
    shown = ", ".join(str(r) for r in group)
    said = " and ".join(f"'{n}' on rank {r}" for r, (n, _) in sorted(by_rank.items()))
    return (f"group [{shown}] is {said}: its members register under different names and wait "
            "for each other forever (on NCCL: its first collective never forms a communicator).")


def _name_shared(seqs: dict[int, list[GroupCall]]) -> str:
    """The first name two groups go by on different ranks: "torch's name '1' is group [0, 1]
    on ranks 0, 1 and group [2, 3] on ranks 2, 3"."""
    meant: dict[str, dict[tuple[int, ...], list[int]]] = {}
    first: dict[str, int] = {}
    for r, seq in seqs.items():
        for c in seq:
            if c.name and r in c.asked:
                meant.setdefault(c.name, {}).setdefault(c.asked, []).append(r)
                first[c.name] = min(first.get(c.name, c.time_ns), c.time_ns)
    shared = [(first[n], n, groups) for n, groups in meant.items() if len(groups) > 1]
    if not shared:
        return ""
    _, name, groups = min(shared)
    said = " and ".join(f"group [{', '.join(str(r) for r in g)}] on {ranks_text(sorted(rs))}"
                        for g, rs in sorted(groups.items()))
    return (f"torch's name '{name}' is {said}: their members meet under one name and connect "
            "to the wrong peers, or wait for each other forever.")


def _finding(title: str, lines: list[str], culprits: list[int], witness: GroupCall,
             evidence: dict) -> Finding:
    fields = call_fields(witness.event) if witness.event is not None else {}
    return Finding(
        kind=FindingKind.GROUP_MISMATCH, severity=Severity.ERROR, title=title,
        detail="\n".join(lines), ranks=tuple(culprits), hint=HINT, op=witness.op,
        time_ns=witness.time_ns or None, evidence=evidence, **fields,
    )
