"""``p2p_mismatch``: a send/receive channel whose two ends disagree (analysis/calls/p2p_channels.py
pairs them).

- **count**: one end posted more calls than the other, and waits (or failed waiting) for the
  rest, while the other end cannot post them: it ended, or it is blocked elsewhere - in a
  collective, or in a channel that is itself short. "rank 0 sent 3 messages to rank 1 since
  barrier #2, rank 1 waits for a 4th". The loops on both sides that made them are named with
  how many each made in its last pass (source/branch.py reads them from the recorded frames).
- **shape** / **dtype**: the n-th send and the n-th receive of a channel describe different
  tensors (gloo and NCCL move bytes: a wider buffer is filled in part, or the job fails later).
- **deadlock**: ranks that each wait to receive from the next, in a cycle, with nothing sent
  (both ranks of a pair receive first).

A pipeline's stage split (``if stage == 0: send ... else: recv ...``) is the design: its arms
pair with each other. No branch is ever blamed here; what differed is how many messages passed.
A rank still computing may yet send: a channel is short only once its short end cannot.
"""

from __future__ import annotations

from typing import Any

from nccl_doctor import paths
from nccl_doctor.analysis.calls.align import blocked_event, leaf_collectives
from nccl_doctor.analysis.who.blame import read_frames, sources_for, source_text
from nccl_doctor.source.branch import Loop, loops
from nccl_doctor.analysis.why.loop_counts import calls_inside
from nccl_doctor.analysis.what.missing import instead
from nccl_doctor.analysis.calls.p2p_channels import (
    P2P, RECVS, SENDS, Channel, channel_of, held, is_excess, messages, p2p_channels,
)
from nccl_doctor.source.source_text import Sources
from nccl_doctor.analysis.calls.wording import call_fields, call_name, call_site, versions_of
from nccl_doctor.diagnosis import Finding, FindingKind, Severity
from nccl_doctor.finding_evidence import P2PEvidence
from nccl_doctor.model import Event, EventState, ExitKind, TraceSet, parse_tensor_desc

HINT_COUNT = (
    "Every send must meet a receive: the two ends of a channel must agree on how many messages "
    "pass, step by step. A pipeline's stages usually disagree on the number of microbatches "
    "(a short last batch cut into fewer of them on one stage only: drop it or pad it on every "
    "stage alike; torch.distributed.pipelining: build every stage's schedule with the same "
    "n_microbatches)."
)
HINT_SHAPE = (
    "A receive's buffer must have the shape and dtype of the tensor sent into it: the bytes are "
    "moved as they are. In a pipeline, a stage's input (PipelineStage's input_args) must be the "
    "previous stage's output."
)
HINT_DEADLOCK = (
    "Each rank waits to receive before it sends, so nobody sends. Order the pair (even ranks "
    "send first, odd ranks receive first), or post both sides at once with "
    "dist.batch_isend_irecv (or isend + irecv, then wait)."
)


def detect_p2p_mismatch(traces: TraceSet) -> list[Finding]:
    p2p = p2p_channels(traces)
    if not p2p.channels:
        return []
    # Ends whose history is not all here: a capture that lost records (damage, a lapped ring),
    # or a window of them that did not keep every message (a large job's window and the
    # supervisor's look at a long run keep them all: ``p2p_whole``): their messages cannot be
    # counted or paired - their channels are left out.
    unsure = traces.damaged_ranks() | {
        r for r, t in traces.ranks.items()
        if (t.recorded is not None and not t.p2p_whole) or t.integrity.overwritten}
    model = _Waits(traces, p2p)
    findings = []
    sources: list[Sources] = []  # (read once, on the first short channel)
    in_cycle = set()
    for cycle in model.receive_cycles():
        if not {r for ch in cycle for r in (ch.src, ch.dst)} & unsure:
            in_cycle.update((ch.group, ch.src, ch.dst) for ch in cycle)
            findings.append(_deadlock(cycle, traces))
    for key, ch in sorted(p2p.channels.items()):
        if {ch.src, ch.dst} & unsure or not {ch.src, ch.dst} <= set(traces.ranks):
            continue  # (or an end that ran unseen)
        findings.extend(_differing(ch, traces))
        # (a run whose end is unknown: the short end may yet post them - behind, not short)
        if ch.short and key not in in_cycle and not traces.unfinished \
                and model.stuck(ch.short_rank):
            if not sources:
                sources.append(sources_for(traces))
            findings.append(_short(ch, traces, model, sources[0]))
    return findings


# -- who waits on whom -------------------------------------------------------------------------

class _Waits:
    """Each rank's wait among its messages, and whether a rank can still post any."""

    def __init__(self, traces: TraceSet, p2p: P2P) -> None:
        self.traces, self.p2p = traces, p2p
        # rank -> (the message it is held in, "waits" | "failed", its channel)
        self.held: dict[int, tuple[Event, str, Channel | None]] = {}
        for rank, trace in traces.ranks.items():
            got = held(trace, tuple(messages(trace)))
            if got is not None:
                self.held[rank] = (got[0], got[1], channel_of(p2p, rank, got[0]))

    def waits_on(self, rank: int) -> Channel | None:
        """The short channel whose unpaired call ``rank`` is held in (its other end is the rank
        it waits on), if any."""
        got = self.held.get(rank)
        if got is None or got[2] is None or not is_excess(got[2], got[0]):
            return None
        return got[2]

    def stuck(self, rank: int, seen: frozenset[int] = frozenset()) -> bool:
        """Whether ``rank`` can post no more calls: it ended (or nccl-doctor stopped it), or it
        is blocked in a collective, or in a short channel whose other end is stuck itself. A
        rank computing, or in a call both ends posted (it completes), may yet post them."""
        trace = self.traces.ranks.get(rank)
        if trace is None:
            return False
        if trace.exit.kind is not ExitKind.RUNNING:
            return True
        got = self.held.get(rank)
        if got is not None and got[1] == "waits":
            ch = self.waits_on(rank)
            if ch is None:
                return False  # (its call is paired: in flight, it completes)
            return rank in seen or self.stuck(ch.short_rank, seen | {rank})
        return blocked_event(trace) is not None

    def receive_cycles(self) -> list[list[Channel]]:
        """Cycles of ranks each held in a receive nothing was sent for, from the next: the
        pair that both receive first. (A cycle through a send is a short channel's; its
        findings say how many were sent.)"""
        out: list[list[Channel]] = []
        done: set[int] = set()
        for start in sorted(self.held):
            path: list[int] = []
            rank: int | None = start
            while rank is not None and rank not in path and rank not in done:
                path.append(rank)
                ch = self.waits_on(rank)
                rank = ch.short_rank if ch is not None else None
            done.update(path)
            if rank is None or rank not in path:
                continue
            cycle = path[path.index(rank):]
            channels = [self.waits_on(r) for r in cycle]
            if all(ch is not None and self.held[r][0].op in RECVS
                   for r, ch in zip(cycle, channels)):
                out.append([ch for ch in channels if ch is not None])
        return out


# -- the findings ------------------------------------------------------------------------------

def _channel_name(ch: Channel) -> str:
    return f"rank {ch.src} -> rank {ch.dst} (group {ch.group})"


def _ordinal(n: int) -> str:
    suffix = "th" if 10 <= n % 100 <= 20 else {1: "st", 2: "nd", 3: "rd"}.get(n % 10, "th")
    return f"{n}{suffix}"


def _a(word: str) -> str:
    """``word`` with its article: "a 4th", "an 8th", "an 11th"."""
    digits = word.rstrip("stndrh")
    an = digits[:1] == "8" or (len(digits) % 3 == 2 and digits[:2] in ("11", "18"))
    return f"{'an' if an else 'a'} {word}"


def _messages(n: int) -> str:
    return f"{n} message{'s' if n != 1 else ''}"


def _short(ch: Channel, traces: TraceSet, model: _Waits, sources: Sources) -> Finding:
    sent, received = len(ch.sends), len(ch.recvs)
    long_rank, short_rank = ch.long_rank, ch.short_rank
    first_excess = ch.excess[0]
    got = model.held.get(long_rank)
    how = got[1] if got is not None and is_excess(ch, got[0]) else ""
    step = _step(ch, traces)
    n_sent, n_received = (step["sent"], step["received"]) if step else (sent, received)
    since = f" since {step['after']}" if step else ""
    if long_rank == ch.dst:  # "rank 0 sent 3 messages to rank 1, rank 1 waits for a 4th"
        waited = {"waits": "waits for", "failed": "failed waiting for",
                  "": "posted a receive for"}[how]
        nth = _a(_ordinal(n_sent + 1)) + ("" if how else " that nothing sent")
        title = (f"p2p {_channel_name(ch)}: rank {ch.src} sent {_messages(n_sent)}{since}, "
                 f"rank {ch.dst} {waited} {nth}")
    else:
        waited = {"waits": "waits to send", "failed": "failed sending", "": "sent"}[how]
        nth = _a(_ordinal(n_received + 1)) + ("" if how else " that nothing received")
        title = (f"p2p {_channel_name(ch)}: rank {ch.dst} received {_messages(n_received)}"
                 f"{since}, rank {ch.src} {waited} {nth}")
    versions = versions_of(traces, long_rank)
    lines = [_count_line(ch, traces, step)]
    e = first_excess
    state = {"waits": "waits in", "failed": "failed in", "": "made"}[how]
    nth = min(sent, received) + 1
    lines.append(f"rank {long_rank} {state} its {e.op} #{nth} "
                 f"on the channel at {call_site(e, versions)}: nothing on rank {short_rank} "
                 "pairs with it.")
    meanwhile = _instead(short_rank, traces, model)
    lines.append(f"Meanwhile {meanwhile}.")
    loops_json, loop_line = _loops(ch, traces, sources)
    if loop_line:
        lines.append(loop_line)
    lines.append("The stage split (one rank sends, the other receives) is the design: a send "
                 "pairs with a receive. What differs is how many messages passed.")
    evidence: dict[str, Any] = {
        "aspect": "count", "src": ch.src, "dst": ch.dst, "sent": sent, "received": received,
        "waiting": {long_rank: how} if how else {}, "instead": {short_rank: meanwhile},
        "loops": loops_json,
    }
    if step:
        evidence["step"] = step
    return Finding(
        kind=FindingKind.P2P_MISMATCH, severity=Severity.ERROR, title=title,
        detail="\n".join(lines), ranks=tuple(sorted((ch.src, ch.dst))), hint=HINT_COUNT,
        group=ch.group, op=e.op, **call_fields(e, versions), evidence=evidence,
        time_ns=e.t_enter_ns)


def _count_line(ch: Channel, traces: TraceSet, step: dict[str, Any] | None) -> str:
    """"rank 0 sent 3 messages to rank 1 since barrier #2 (the last at ...); rank 1 posted 4
    receives from rank 0 since then (the last at ...)"."""
    parts = []
    for rank, ops, other in ((ch.src, ch.sends, ch.dst), (ch.dst, ch.recvs, ch.src)):
        n = (step["sent"] if rank == ch.src else step["received"]) if step else len(ops)
        what = (f"sent {_messages(n)} to rank {other}" if rank == ch.src
                else f"posted {n} receive{'s' if n != 1 else ''} from rank {other}")
        since = "" if not step else f" since {step['after']}" if not parts else " since then"
        last = f" (the last at {call_site(ops[-1], versions_of(traces, rank))})" if ops else ""
        parts.append(f"rank {rank} {what}{since}{last}")
    total = (f" ({len(ch.sends)} sent and {len(ch.recvs)} received in all)" if step else "")
    return "; ".join(parts) + total + "."


def _instead(rank: int, traces: TraceSet, model: _Waits) -> str:
    """What the short end does meanwhile, in words."""
    got = model.held.get(rank)
    if got is not None and got[2] is not None:
        e, how, ch = got
        peer = ch.dst if rank == ch.src else ch.src
        what = "a send to" if e.op in SENDS else "a receive from"
        verb = "is blocked in" if how == "waits" else "failed in"
        short = " (that channel is short too)" if model.waits_on(rank) is ch else ""
        return (f"rank {rank} {verb} {what} rank {peer} (group {ch.group}) at "
                f"{call_site(e, versions_of(traces, rank))}{short}")
    return instead(traces.ranks.get(rank), rank)[1]


def _step(ch: Channel, traces: TraceSet) -> dict[str, Any] | None:
    """The messages each end made since the last collective of the channel's group that both
    completed (a training step's boundary, where the job has one), or None."""
    done = []
    for rank in (ch.src, ch.dst):
        trace = traces.ranks[rank]
        done.append({e.align_seq: e for e in leaf_collectives(trace)
                     if e.group == ch.group and e.state is EventState.RETURNED})
    common = set(done[0]) & set(done[1])
    if not common:
        return None
    seq = max(common)
    after_src, after_dst = done[0][seq].idx, done[1][seq].idx
    return {"after": call_name(done[0][seq]),
            "sent": sum(1 for e in ch.sends if e.idx > after_src),
            "received": sum(1 for e in ch.recvs if e.idx > after_dst)}


# -- the loops that made them ------------------------------------------------------------------

def _loops(ch: Channel, traces: TraceSet, sources: Sources,
           ) -> tuple[list[dict[str, Any]], str]:
    """Each end's innermost loop around its calls on the channel (its own where the ends' loops
    differ), with how many calls on the channel it made in its last pass; and a sentence when
    the counts differ."""
    found: dict[int, tuple[Loop, ...]] = {}
    for rank, ops in ((ch.src, ch.sends), (ch.dst, ch.recvs)):
        if ops:
            e = ops[-1]
            found[rank] = loops(read_frames(e.path, e.callsite), sources)
    if len(found) < 2 or not all(found.values()):
        return [], ""
    keys = {rank: {(lp.path, lp.line) for lp in got} for rank, got in found.items()}
    out, said = [], []
    for rank, got in found.items():
        other = next(r for r in found if r != rank)
        own = [lp for lp in got if (lp.path, lp.line) not in keys[other]]
        loop = own[0] if own else got[0]
        ops = {e.idx for e in ch.ops(rank)}
        n = calls_inside(traces, rank, loop, lambda e, ops=ops: e.idx in ops)
        text = source_text(loop.text)
        out.append({"rank": rank, "path": loop.path, "line": loop.line, "text": text,
                    "calls": n})
        what = "sends" if rank == ch.src else "receives"
        said.append(f"rank {rank}'s loop at {paths.short_path(loop.path)}:{loop.line} "
                    f"(`{text}`) made {n} {what} on the channel in its last pass")
    if len({x["calls"] for x in out}) < 2:
        return out, ""
    a, b = out
    if (a["path"], a["line"]) == (b["path"], b["line"]):  # the ends' calls share their loop
        return out, (f"In the last pass of the loop at {paths.short_path(a['path'])}:{a['line']} "
                     f"(`{a['text']}`) rank {ch.src} made {out[0]['calls']} sends on the "
                     f"channel and rank {ch.dst} {out[1]['calls']} receives.")
    return out, "The loops ran a different number of times: " + "; ".join(said) + "."


# -- shapes and dtypes -------------------------------------------------------------------------

def _differing(ch: Channel, traces: TraceSet) -> list[Finding]:
    """The first send whose receive describes another tensor (and how many differ)."""
    pairs = [(s, r) for s, r in zip(ch.sends, ch.recvs)
             if s.input and r.input and parse_tensor_desc(s.input) != parse_tensor_desc(r.input)]
    if not pairs:
        return []
    s, r = pairs[0]
    n = next(i for i, (x, y) in enumerate(zip(ch.sends, ch.recvs), 1) if x is s)
    sent, got = parse_tensor_desc(s.input), parse_tensor_desc(r.input)
    aspect = "dtype" if [t.dtype for t in sent] != [t.dtype for t in got] else "shape"
    more = f" ({len(pairs) - 1} more on this channel differ)" if len(pairs) > 1 else ""
    title = (f"p2p {_channel_name(ch)}: message #{n} sent as {s.input}, received into "
             f"{r.input}{more}")
    v_src, v_dst = versions_of(traces, ch.src), versions_of(traces, ch.dst)
    detail = (f"rank {ch.src} sent {s.input} at {call_site(s, v_src)}.\n"
              f"rank {ch.dst} received it into {r.input} at {call_site(r, v_dst)}.\n"
              f"The {aspect}s differ: the backend moves bytes, so the receive is filled in "
              "part, or with the wrong type, or fails.")
    # a job that ended well received wrong data silently; one that failed or hangs, because
    hurt = any(t.exit.abnormal or t.exit.was_running for t in traces.ranks.values())
    return [Finding(
        kind=FindingKind.P2P_MISMATCH, severity=Severity.ERROR if hurt else Severity.WARNING,
        title=title, detail=detail, ranks=tuple(sorted((ch.src, ch.dst))), hint=HINT_SHAPE,
        group=ch.group, op=r.op, **call_fields(r, v_dst),
        evidence={"aspect": aspect, "src": ch.src, "dst": ch.dst, "sent": len(ch.sends),
                  "received": len(ch.recvs), "message": n, "differing": len(pairs),
                  "sent_input": s.input, "received_input": r.input},
        time_ns=max(s.t_enter_ns, r.t_enter_ns))]


# -- a cycle of receives -----------------------------------------------------------------------

def _deadlock(cycle: list[Channel], traces: TraceSet) -> Finding:
    """Ranks each held in a receive from the next that nothing sent."""
    waits = [(ch.dst, ch.src, ch.recvs[len(ch.sends)]) for ch in cycle]
    ranks = [dst for dst, _, _ in waits]
    said = " and ".join(f"rank {dst} waits to receive from rank {src}" for dst, src, _ in waits)
    failed = all(traces.ranks[d].exit.kind is not ExitKind.RUNNING
                 and traces.ranks[d].exit.abnormal for d in ranks)
    title = f"p2p deadlock: {said}; neither sent" if len(waits) == 2 else \
        f"p2p deadlock: {said}; none sent"
    lines = [f"rank {dst} posted a receive from rank {src} at "
             f"{call_site(e, versions_of(traces, dst))} (group {e.group}) with no send from "
             f"rank {src} to pair with it." for dst, src, e in waits]
    lines.append("Every rank of the cycle waits to receive before it sends"
                 + (" (the backend's timeout ended the wait)." if failed else "."))
    first = waits[0][2]
    return Finding(
        kind=FindingKind.P2P_MISMATCH, severity=Severity.ERROR, title=title,
        detail="\n".join(lines), ranks=tuple(sorted(ranks)), hint=HINT_DEADLOCK,
        group=first.group, op=first.op, **call_fields(first, versions_of(traces, waits[0][0])),
        evidence={"aspect": "deadlock", "sent": sum(len(ch.sends) for ch in cycle),
                  "received": sum(len(ch.recvs) for ch in cycle), "cycle": ranks,
                  "waiting": {dst: "waits" for dst in ranks}},
        time_ns=max(e.t_enter_ns for _, _, e in waits))


# -- what a short channel explains -------------------------------------------------------------

def without_p2p_waits(findings: list[Finding]) -> list[Finding]:
    """``findings`` less each missing_collective whose absent ranks all wait (or failed
    waiting) in a short channel's unpaired call, or in a receive cycle: they are not away from
    the collective at a branch - the stage split is the design - they are held by the channel,
    whose finding is the cause (and says where the other end went instead)."""
    held = {r for f in findings if f.kind is FindingKind.P2P_MISMATCH
            and isinstance(f.evidence, P2PEvidence) for r in f.evidence.waiting}
    if not held:
        return findings
    return [f for f in findings if not (f.kind is FindingKind.MISSING_COLLECTIVE and f.absent
                                        and set(f.absent) <= held)]
