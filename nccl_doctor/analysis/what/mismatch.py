"""``collective_mismatch``: ranks entered collective #N of a group with different arguments."""

from __future__ import annotations

from collections import defaultdict
from typing import Any

from nccl_doctor import words
from nccl_doctor.analysis.calls.align import canonical_op, timelines
from nccl_doctor.analysis.calls.wording import (
    call_fields, call_site, ranks_text, versions_of,
)
from nccl_doctor.diagnosis import Finding, FindingKind, Severity
from nccl_doctor.model import Event, EventSource, TraceSet, parse_tensor_desc

# Which argument must have the same shape and dtype on every rank, per op. all_to_all_single with
# split sizes and the list forms (whose lists exist on the root only) are not compared.
_SAME_INPUT = {
    "all_reduce", "all_reduce_coalesced", "all_gather", "all_gather_into_tensor", "reduce",
    "broadcast", "gather", "reduce_scatter_tensor", "reduce_scatter", "all_to_all",
}
_SAME_OUTPUT = {"scatter"}
_ROOTED = {"reduce", "broadcast", "gather", "scatter"}

HINTS = {
    "op": "The ranks took different code paths, so their calls no longer pair up: look for a "
          "branch on the rank (if rank == 0: ...), an exception caught on one rank, or a loop "
          "whose length differs per rank. Every rank must issue the same collectives in the same "
          "order.",
    "shape": "Each rank passed a tensor of a different shape. The usual cause is per-rank padding "
             "(each rank pads to its own longest sequence): pad to a length agreed across ranks, or "
             "gather a reduced value (tensor.mean(), counts) instead of the tensor itself.",
    "dtype": "Cast to one dtype on every rank before the collective (mixed precision on some "
             "ranks only?).",
    "root": "Pass the same src/dst on every rank.",
    "group_size": "The ranks disagree about the group's membership: call new_group on every rank, "
                  "in the same order, with the same ranks.",
}


def _signature(e: Event) -> dict[str, Any]:
    """The aspects that must agree across ranks. A Flight Recorder event (issued from C++)
    carries its op only: its root is unknown and its tensors are described differently."""
    op = canonical_op(e.op)
    desc = e.input if op in _SAME_INPUT else e.output if op in _SAME_OUTPUT else ""
    sigs = parse_tensor_desc(desc)
    if e.source is EventSource.FLIGHT_RECORDER:
        # compared with other Flight Recorder entries only (``_ASPECTS``' fr_ keys)
        return {"op": op, "fr_dtype": tuple(s.dtype for s in sigs),
                "fr_shape": tuple((s.count, s.shape) for s in sigs)}
    return {
        "op": op,
        "group_size": e.group_size,
        "root": e.peer if op in _ROOTED else None,
        "dtype": tuple(s.dtype for s in sigs),
        "shape": tuple((s.count, s.shape) for s in sigs),
    }


#: The aspects compared, in order; Flight Recorder entries describe their tensors in their own
#: form, so their dtypes and shapes are compared among themselves (the ``fr_`` keys).
_ASPECTS = ("op", "group_size", "root", "dtype", "shape", "fr_dtype", "fr_shape")


def _describe(aspect: str, e: Event) -> str:
    if aspect == "op":
        return e.op
    if aspect in ("shape", "dtype"):
        op = canonical_op(e.op)
        return (e.output if op in _SAME_OUTPUT else e.input) or "-"
    if aspect == "root":
        return f"root {e.peer}"
    return f"group of {e.group_size}"


def _signature_cached(e: Event, cache: dict) -> dict[str, Any]:
    key = (e.op, e.source, e.input, e.output, e.group_size, e.peer)
    sig = cache.get(key)
    if sig is None:
        sig = cache[key] = _signature(e)
    return sig


def detect_collective_mismatch(traces: TraceSet) -> list[Finding]:
    findings = []
    cache: dict[tuple, dict[str, Any]] = {}  # thousands of calls share a few signatures
    for name, timeline in sorted(timelines(traces).items()):
        for seq in timeline.seqs():
            by_rank = timeline.calls[seq]
            if len(by_rank) < 2:
                continue
            sigs = {rank: _signature_cached(e, cache) for rank, e in by_rank.items()}
            if len({id(s) for s in sigs.values()}) == 1:
                continue  # every rank made the very same call (the cache shares its signature)
            aspect = next(
                (a for a in _ASPECTS if len({repr(s[a]) for s in sigs.values() if a in s}) > 1),
                None,
            )
            if aspect is None:
                continue
            known = {r: e for r, e in by_rank.items() if aspect in sigs[r]}
            findings.append(_finding(name, seq, known, sigs, aspect,
                                     timeline.calls.get(seq + 1, {}), traces))
            break  # the first divergence of a group is the cause; what follows is cascade
    return findings


def _same_call(a: Event, b: Event | None) -> bool:
    return (b is not None and canonical_op(a.op) == canonical_op(b.op)
            and a.callsite == b.callsite and a.input == b.input)


def _odd_without_majority(ordered: list[list[int]], by_rank: dict[int, Event],
                          following: dict[int, Event]) -> tuple[list[int], str, str]:
    """With no majority, the side to name and why. A side whose call #N is the very call every
    other side makes next (#N+1, same op, line and tensors) skipped their call #N: it is the
    odd one. Otherwise the sides that differ from the lowest rank's call are named, as PyTorch's
    Flight Recorder analyzer does - a convention, which the report says."""
    skipped = [side for side in ordered
               if all(any(_same_call(by_rank[side[0]], following.get(r)) for r in other)
                      for other in ordered if other is not side)]
    if len(skipped) == 1:
        (side,) = skipped
        other = next(rs for rs in ordered if rs is not side)
        e = by_rank[other[0]]
        verb = words.verb(other, "makes")
        return side, (f"No majority, but {ranks_text(side)}'s call #{e.align_seq} is the call "
                      f"{ranks_text(other)} {verb} next: {ranks_text(side)} skipped {e.op} at "
                      f"{call_site(e)}."), "skipped"
    reference = min(ordered, key=lambda rs: rs[0])
    odd = sorted(r for rs in ordered if rs is not reference for r in rs)
    return odd, (f"No majority: {ranks_text(odd)} named for differing from rank "
                 f"{reference[0]}, the lowest rank (as PyTorch's Flight Recorder analyzer "
                 "does); the fault may lie on either side."), "lowest_rank"


def _finding(group: str, seq: int, by_rank: dict[int, Event], sigs: dict, aspect: str,
             following: dict[int, Event], traces: TraceSet) -> Finding:
    classes: dict[str, list[int]] = defaultdict(list)
    for rank in sorted(by_rank):
        classes[repr(sigs[rank][aspect])].append(rank)
    aspect = aspect.removeprefix("fr_")
    ordered = sorted(classes.values(), key=lambda rs: (-len(rs), rs[0]))
    majority = ordered[0] if len(ordered[0]) > len(ordered[1]) else None
    if majority is None:
        odd, why, blame = _odd_without_majority(ordered, by_rank, following)
    else:
        odd = sorted(r for rs in ordered if rs is not majority for r in rs)
        verb = words.verb(odd, "disagrees")
        why = f"The odd {ranks_text(odd)} {verb} with the majority ({ranks_text(majority)})."
        blame = "majority"
    sides = []
    for rs in ordered:
        e = by_rank[rs[0]]
        versions = versions_of(traces, rs[0])
        fields = call_fields(e, versions)
        sides.append({
            "ranks": rs, "op": e.op, "value": _describe(aspect, e), "input": e.input,
            "output": e.output, "callsite": call_site(e, versions),
            "issuing": fields["callsite"], "entry": fields["entry_callsite"],
            "call_path": list(fields["call_path"]), "state": e.state.name.lower(),
        })
    first = by_rank[odd[0]]
    ops = sorted({e.op for e in by_rank.values()})
    op_text = " / ".join(ops)
    values = "; ".join(f"{ranks_text(s['ranks'])}: {s['value']}" for s in sides)
    noun = {"group_size": "group sizes", "root": "roots", "op": "ops"}.get(aspect, aspect + "s")
    title = f"{op_text} #{seq} of group {group}: {noun} differ ({values})"
    lines = [
        f"{ranks_text(s['ranks'])}: {s['op']}({s['input'] or '-'}) at {s['callsite']} "
        f"[{s['state']}]" for s in sides
    ]
    lines.append(why)
    return Finding(
        kind=FindingKind.COLLECTIVE_MISMATCH, severity=Severity.ERROR, title=title,
        detail="\n".join(lines), ranks=tuple(odd), hint=HINTS[aspect], group=group, seq=seq,
        op=first.op, **call_fields(first, versions_of(traces, odd[0])),
        evidence={"aspect": aspect, "sides": sides, "majority": majority, "why": why,
                  "blame": blame},
        time_ns=min(e.t_enter_ns for e in by_rank.values()),
    )
