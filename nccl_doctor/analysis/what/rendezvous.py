"""Ranks that wait in the rendezvous of ``init_process_group`` (pure): a world the ranks see
differently, and ranks that never came.

Before ``init_process_group`` returns no rank has a capture; what is known is each rank's
joining record (capture/joining.py: which world it joins, where it meets the others) and,
live, its stack. Ranks told different addresses, ports or world sizes can never meet: that is
certain at once. A rank that never reaches the call may only be slow (importing, loading data
before it), so the watchdog waits ``--stuck-after`` for it (docs/watchdog.md).
"""

from __future__ import annotations

from typing import Mapping

from nccl_doctor.diagnosis import Finding, FindingKind, Severity
from nccl_doctor.model import Joining, TraceSet
from nccl_doctor.stacks.places import Place
from nccl_doctor.words import ranks_text, ranks_verb

HINT_PARTED = (
    "Every rank must be given the same rendezvous: the same MASTER_ADDR and MASTER_PORT (or "
    "init_method) and the same world size. A rank told another address waits there alone, and "
    "the others wait for it until the init timeout. Check what sets them per rank: a launcher "
    "flag, an environment file, code that overrides os.environ on some ranks."
)
HINT_ABSENT = (
    "The ranks in init_process_group wait for every rank of the world to join. The absent "
    "ranks never called it: they failed to start, are stuck before it (their stacks, where "
    "they could be taken, say where), or run on a host whose launcher was not started. "
    "Check the world size and each node's launch."
)


def detect_rendezvous(traces: TraceSet) -> list[Finding]:
    """Offline, from the joining records of a job none of whose ranks got past
    init_process_group: ranks told different rendezvous, else ranks that never began it."""
    if traces.ranks or not traces.joining or traces.unfinished:
        return []
    found = parted(traces.joining)
    if found is not None:
        return [found]
    absent = absent_ranks(traces.joining, (*traces.early_exits, *traces.unrecorded))
    return [never_joined(traces.joining, absent, {}, None)] if absent else []


def absent_ranks(joinings: Mapping[int, Joining], accounted: tuple[int, ...] = ()) -> list[int]:
    """The ranks of the world the joining ranks think they join that did not begin
    init_process_group (``accounted``: ranks known otherwise - raised before it, unrecorded)."""
    world = max((j.world_size for j in joinings.values()), default=0)
    return [r for r in range(world) if r not in joinings and r not in accounted]


def parted(joinings: Mapping[int, Joining]) -> Finding | None:
    """The ranks were told different rendezvous (addresses, ports, world sizes): they can
    never meet. None while they agree."""
    by_place: dict[tuple[str, int], list[int]] = {}
    for r, j in sorted(joinings.items()):
        by_place.setdefault((j.address, j.world_size), []).append(r)
    if len(by_place) < 2:
        return None
    sides = sorted(by_place.items(), key=lambda kv: (-len(kv[1]), kv[1][0]))
    (_, most), rest = sides[0], sides[1:]
    odd = sorted(r for _, ranks in rest for r in ranks)
    said = "; ".join(f"{ranks_verb(ranks, 'waits')} at {_where(place)}"
                     for place, ranks in sides)
    title = (f"{ranks_text(odd)} joined another rendezvous than {ranks_text(most)}: {said}; "
             "they can never meet")
    lines = [f"rank {r}: {_where((joinings[r].address, joinings[r].world_size))}, "
             f"{joinings[r].backend or 'default backend'}, on {joinings[r].host or '?'} "
             f"(pid {joinings[r].pid})" for r in sorted(joinings)]
    return Finding(
        kind=FindingKind.BLOCKED_WAIT, severity=Severity.ERROR, title=title,
        detail="\n".join(lines), ranks=tuple(odd), hint=HINT_PARTED, op="init_process_group",
        evidence={"place": {str(r): "rendezvous" for r in joinings},
                  "rendezvous": {str(r): _where((j.address, j.world_size))
                                 for r, j in sorted(joinings.items())}},
        time_ns=min((j.time_ns for j in joinings.values()), default=None) or None,
    )


def never_joined(joinings: Mapping[int, Joining], absent: list[int],
                 places: Mapping[int, Place], waited_s: float | None,
                 alive: Mapping[int, tuple[int, Place | None]] | None = None) -> Finding:
    """``absent`` ranks never began ``init_process_group`` while the others wait in it
    (``waited_s``: for how long since the last of them came, when known; ``alive``: an absent
    rank's process found on this host -> its pid and where its stack is)."""
    present = sorted(joinings)
    j = joinings[present[0]]
    waited = f" for {waited_s:.0f} s" if waited_s is not None else ""
    title = (f"{ranks_text(absent)} never joined the rendezvous at "
             f"{_where((j.address, j.world_size))}: {ranks_verb(present, 'waits')} in "
             f"init_process_group{waited}")
    lines = []
    for r in present:
        where = places.get(r)
        lines.append(f"rank {r} waits " + (where.describe() if where is not None
                                          else "in init_process_group") + ".")
    alive = alive or {}
    unseen = [r for r in absent if r not in alive]
    for r in absent:
        if r in alive:
            pid, where = alive[r]
            lines.append(f"rank {r} (pid {pid}) is running and has not called "
                         "init_process_group: it is " + (
                             where.describe() if where is not None
                             else "somewhere its stack did not show") + ".")
    if unseen:
        lines.append(f"{ranks_text(unseen)}: no process of {'it' if len(unseen) == 1 else 'them'}"
                     " on this host, and no sign of reaching init_process_group.")
    # the absent rank's own line is where to look, when its process was found
    frame = next((w.frame for _, w in alive.values() if w is not None and w.frame is not None),
                 None) or next((p.frame for p in places.values() if p.frame is not None), None)
    return Finding(
        kind=FindingKind.BLOCKED_WAIT, severity=Severity.ERROR, title=title,
        detail="\n".join(lines), ranks=tuple(absent), hint=HINT_ABSENT,
        op="init_process_group", callsite=frame.text() if frame is not None else None,
        evidence={"place": {str(r): "rendezvous" for r in present},
                  "waiting_ranks": present,
                  **({"absent_at": {str(r): {"pid": pid, "place": w.kind.value if w else None,
                                             "frame": w.frame.text() if w and w.frame else None}
                                    for r, (pid, w) in sorted(alive.items())}}
                     if alive else {})},
        time_ns=max((x.time_ns for x in joinings.values()), default=None) or None,
    )


HINT_STUCK = (
    "Every rank reached init_process_group and none got out of it: the ranks met at the "
    "rendezvous and then could not connect to each other, or a rank that failed there left "
    "the others waiting. Their stacks and the failed rank's error say which. After a "
    "launcher's restart (torchrun --max-restarts) torch's gloo is known to fail so: a new "
    "attempt's ranks connect to an address of the attempt before. Stop the job; a fresh "
    "launch (a new MASTER_PORT or rendezvous id) starts clean."
)
HINT_LAUNCHER = (
    "Every rank of the job has ended and its launcher neither restarted them nor exited. "
    "Stop it; the ranks' own errors (above) say why they ended. torch's elastic agent is "
    "known to stay so after a restarted attempt failed while its ranks connected."
)


def stuck_joining(joinings: Mapping[int, Joining], ended: Mapping[int, str], waited_s: float,
                  places: Mapping[int, Place] | None = None) -> Finding:
    """Every rank of the world began ``init_process_group`` at one rendezvous and none
    returned for ``waited_s``: those still in it (``places``: where their stacks are) wait for
    nothing that will come; ``ended``: the ranks whose process is gone -> how (their error, or
    "ended with no error": a launcher's stop). All gone: the launcher runs on without them."""
    present = sorted(joinings)
    j = joinings[present[0]]
    waiting = [r for r in present if r not in ended]
    raised = [r for r in present if r in ended and ended[r] != ENDED_QUIETLY]
    at = _where((j.address, j.world_size))
    if not waiting:
        title = (f"every rank joined the rendezvous at {at} and has ended "
                 f"({'; '.join(f'rank {r} {ended[r]}' for r in present)}); the launcher has run "
                 f"on without them for {waited_s:.0f} s")
        hint = HINT_LAUNCHER
    else:
        why = (f", after {ranks_text(raised)} ended: "
               + "; ".join(f"rank {r} {ended[r]}" for r in raised)) if raised else ""
        title = (f"{ranks_verb(waiting, 'has')} been in init_process_group at {at} for "
                 f"{waited_s:.0f} s, the whole world joined and none returned{why}")
        hint = HINT_STUCK
    lines = [f"rank {r} (pid {joinings[r].pid}): "
             + (ended[r] if r in ended else
                (places[r].describe() if places and r in places else "in init_process_group"))
             for r in present]
    frame = next((p.frame for p in (places or {}).values() if p.frame is not None), None)
    return Finding(
        kind=FindingKind.BLOCKED_WAIT, severity=Severity.ERROR, title=title,
        detail="\n".join(lines), ranks=tuple(raised or waiting or present), hint=hint,
        op="init_process_group", callsite=frame.text() if frame is not None else None,
        evidence={"place": {str(r): "rendezvous" for r in waiting},
                  "waiting_ranks": waiting, "ended_ranks": sorted(ended)},
        time_ns=max((x.time_ns for x in joinings.values()), default=None) or None,
    )


#: how ``stuck_joining`` says a rank whose process ended without an error record
ENDED_QUIETLY = "ended with no error (stopped by its launcher, or a signal)"


def _where(place: tuple[str, int]) -> str:
    address, world = place
    return f"{address or 'an unknown address'} (world size {world})"
