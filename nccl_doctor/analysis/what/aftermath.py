"""What became of the collectives a hang was called on (pure): completed - the job moved on,
the hang report is retracted - or ended by the backend - NCCL's watchdog aborting the
communicator, a gloo timeout, a rank taken down by SIGABRT - which is a consequence of the hang,
never progress."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

from nccl_doctor.analysis.calls.wording import call_name
from nccl_doctor.capture.flight_recorder import entry_fate
from nccl_doctor.model import EventKind, EventState, TraceSet


@dataclass(frozen=True)
class Fate:
    completed: bool = False  # a stuck call completed (and none was aborted): progress
    aborted: tuple[str, ...] = ()  # what the backend did, one clause per rank


def stuck_calls_fate(traces: TraceSet, stuck: Mapping[int, tuple[str, int, bool]],
                     fr: Mapping[int, Mapping[str, Any]]) -> Fate:
    """``stuck``: rank -> (group, seq, whether only Flight Recorder tells its completion: work
    in flight on the GPU, or issued from C++); ``fr``: fresh Flight Recorder dumps of them."""
    aborted: list[str] = []
    completed = False
    first_seq: dict[str, int] = {}
    for group, seq, _ in stuck.values():
        first_seq[group] = min(first_seq.get(group, seq), seq)
    for rank, trace in sorted(traces.ranks.items()):
        if trace.exit.abnormal:
            aborted.append(f"rank {rank} {trace.exit.describe(short=True)}")
            continue
        failed = [e for e in trace.events if e.state is EventState.FAILED
                  and e.kind in (EventKind.COLLECTIVE, EventKind.P2P)
                  and e.group in first_seq and e.seq >= first_seq[e.group]]
        if failed:
            aborted.append(f"rank {rank}'s {call_name(failed[0])} failed")
            continue
        if rank not in stuck:
            continue
        group, seq, via_fr = stuck[rank]
        if via_fr:
            fate = entry_fate(fr[rank], group, seq) if rank in fr else None
            if fate == "timed_out":
                aborted.append(f"rank {rank}'s collective #{seq} of group {group} timed out "
                               "(Flight Recorder: retired, never completed)")
            completed = completed or fate == "completed"
            continue
        call = next((e for e in reversed(trace.events) if e.group == group and e.seq == seq
                     and e.kind is not EventKind.WAIT), None)
        completed = completed or (call is not None and call.state is EventState.RETURNED)
    return Fate(completed=completed and not aborted, aborted=tuple(aborted))
