"""The root cause of last resort (pure): a job that failed while no pass found why - every rank
raised inside the same call, say - still has one. It is the first error: which rank raised it
(or was signalled), when, inside which call and at which line, and what the ranks that failed in
that call passed to it differently (the recorded tensors, roots, group sizes), since that is
usually why the backend refused it."""

from __future__ import annotations

from nccl_doctor.analysis.calls.align import canonical_op
from nccl_doctor.analysis.what.exited import first_line
from nccl_doctor.analysis.calls.wording import call_fields, call_name, site
from nccl_doctor.diagnosis import Finding, FindingKind, Severity
from nccl_doctor.model import Event, EventKind, EventState, ExitKind, RankTrace, TraceSet
from nccl_doctor.words import ranks_text, ranks_verb

HINT = (
    "This is the first error of the run; what followed may be its consequence. Where the ranks "
    "passed different arguments to the call they failed in, make them agree (every rank of a "
    "collective passes tensors of the sizes the call expects: an all_gather's output is the "
    "world size times its input); else fix the error itself."
)
#: the arguments a call's records keep, as a finding names them
_ARGUMENTS = (("input", "input"), ("output", "output"), ("peer", "root/peer"),
              ("group_size", "group size"))


def first_error(traces: TraceSet) -> Finding | None:
    """The earliest rank that ended by an exception or a signal, and the call it failed in
    (None: no rank did)."""
    failed = [(t.exit.time_ns or 0, r) for r, t in traces.ranks.items()
              if t.exit.kind in (ExitKind.EXCEPTION, ExitKind.SIGNAL)]
    if not failed:
        return None
    _, rank = min(failed)
    trace = traces.ranks[rank]
    call = _failed_call(trace)
    ex = trace.exit
    what = (f"raised {first_line(ex.exception or 'an exception', 120)}"
            if ex.kind is ExitKind.EXCEPTION else f"was killed by {ex.signal or 'a signal'}")
    if call is None:
        where = f" at {ex.callsite.text()}" if ex.callsite is not None else ""
        return Finding(
            kind=FindingKind.RANK_EXITED, severity=Severity.ERROR,
            title=f"rank {rank} {what}{where}: the first error of the run",
            detail=f"rank {rank} {what}{where}, outside any collective.", ranks=(rank,),
            hint=HINT, callsite=ex.callsite.text() if ex.callsite is not None else None,
            evidence={"exit": ex.kind.value}, time_ns=ex.time_ns)
    together = _failed_in(traces, call)
    others = sorted(r for r in together if r != rank)
    title = f"rank {rank} {what} in {call_name(call)} at {site(call.callsite)}"
    if others:
        title += f"; {ranks_verb(others, 'failed')} in it too"
    lines = [f"rank {r} {_fate(traces.ranks[r])} in {call_name(e)}." for r, e in
             sorted(together.items())]
    differ = _differing(together)
    lines += [f"their {name} differs: " + ", ".join(f"{v} on {ranks_text(rs)}"
                                                     for v, rs in values)
              for name, values in differ]
    return Finding(
        kind=FindingKind.RANK_EXITED, severity=Severity.ERROR, title=title,
        detail="\n".join(lines), ranks=(rank,), hint=HINT, group=call.group,
        seq=call.align_seq, op=call.op, **call_fields(call),
        evidence={"exit": ex.kind.value, "failed_together": sorted(together),
                  "differs": {name: {v: rs for v, rs in values} for name, values in differ}},
        time_ns=ex.time_ns)


def _failed_call(trace: RankTrace) -> Event | None:
    """The innermost call the rank's last failure was raised in (a leaf: the object collective
    around it failed because it did)."""
    for e in reversed(trace.events):
        if e.state is EventState.FAILED and e.kind in (EventKind.COLLECTIVE, EventKind.P2P):
            return e
    return None


def _failed_in(traces: TraceSet, call: Event) -> dict[int, Event]:
    """rank -> its failed record of the same call (its group and number; the op, for a call
    that took no number)."""
    out = {}
    for r, t in traces.ranks.items():
        e = _failed_call(t)
        if e is not None and e.group == call.group and (
                e.align_seq == call.align_seq if call.seq >= 0 else
                canonical_op(e.op) == canonical_op(call.op)):
            out[r] = e
    return out


def _fate(trace: RankTrace) -> str:
    ex = trace.exit
    if ex.kind is ExitKind.EXCEPTION:
        return f"raised {first_line(ex.exception or 'an exception', 100)}"
    if ex.kind is ExitKind.SIGNAL:
        return f"was killed by {ex.signal or 'a signal'}"
    return "failed"


def _differing(calls: dict[int, Event]) -> list[tuple[str, list[tuple[str, list[int]]]]]:
    """What the ranks' records of one call disagree on: (argument, [(value, ranks)])."""
    out = []
    for attr, name in _ARGUMENTS:
        by_value: dict[str, list[int]] = {}
        for r, e in sorted(calls.items()):
            value = getattr(e, attr)
            by_value.setdefault(str(value) if value not in ("", -1) else "none", []).append(r)
        if len(by_value) > 1:
            out.append((name, sorted(by_value.items(), key=lambda kv: kv[1][0])))
    return out
