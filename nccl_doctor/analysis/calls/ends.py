"""How each rank ended (pure): one pass for the loader, the supervisor's post mortem, the
federation and replay alike (``with_ends_known``), and the judgement of a rank without an exit record
from what it finished (``with_finished_marked``, in the analysis).

A rank's capture says how it ended when it could (clean, an exception, a signal, a fault); what
the rest means depends on what is known beside it: a rank whose node was lost is ``LOST``; one
that ended (or never did) after the watchdog or the user stopped the job is ``STOPPED``; one
with no exit record once the job is over ``VANISHED``.

Python's atexit, where the recorder writes a rank's exit record, does not run for every rank
that ends well: Ray ends its workers without it, a script may leave by os._exit, a launcher may
SIGKILL what is left after success. Such a rank reads "vanished" at first; it is ``FINISHED``
when its work is known to be done: it destroyed its default process group (the recorder notes
that), or its last collective completed, no peer went on to a collective it never entered, and
the job exited 0.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Mapping

from nccl_doctor.analysis.calls.align import blocked_event, last_leaf, timelines
from nccl_doctor.model import EventState, ExitKind, RankExit, RankTrace, TraceSet
from nccl_doctor.watch_log import WatchLog


@dataclass(frozen=True)
class Ending:
    """What is known of the job's end beyond each rank's own record."""

    ended: bool = False  # the job is over: a rank with no exit record is not running
    stopped_at: float | None = None  # when the job began to be stopped (unix seconds)
    signals: tuple[str, ...] = ()  # what stopped it
    # rank -> (its host, when the host was lost, ns): the ranks of nodes lost to the job
    lost: Mapping[int, tuple[str, int | None]] = field(default_factory=dict)
    # the job was stopped by nccl-doctor (its manifest says so), but the record of when is lost
    # (a damaged watchdog.json): a rank with no exit record was stopped, not vanished
    stop_unknown: bool = False

    @classmethod
    def of(cls, watch: WatchLog | None, *, ended: bool,
           lost: Mapping[int, tuple[str, int | None]] | None = None) -> Ending:
        """The ending a watchdog's record tells (its stop), for a job ``ended`` or not."""
        return cls(ended=ended, stopped_at=watch.stopped_at if watch is not None else None,
                   signals=watch.signals if watch is not None else (), lost=lost or {})


def this_attempts(watch: WatchLog | None, traces: TraceSet) -> WatchLog | None:
    """``watch`` (the watchdog's record) without what it recorded before ``traces``' ranks
    began, where they are a launcher's restart: watchdog.json, and a supervisor's own record,
    hold every attempt's decisions - an earlier one's hang (``--on-hang restart``), interrupt
    (a Slurm requeue) or stop is not this attempt's (analysis/attempts.py gives each earlier
    attempt its own window)."""
    if watch is None:
        return None
    attempts = {t.meta.attempt for t in traces.ranks.values()}
    attempts |= {j.attempt for j in traces.joining.values()}
    attempts |= {e.attempt for e in traces.early_exits.values()}
    if attempts <= {(0, 0)}:  # the first launch: all it recorded is its own
        return watch
    starts = [t.meta.started_ns for t in traces.ranks.values() if t.meta.started_ns]
    starts += [j.time_ns for j in traces.joining.values() if j.time_ns]  # (no capture made:
    starts += [e.time_ns for e in traces.early_exits.values() if e.time_ns]  # its records)
    if not starts:
        return watch
    kept = tuple(e for e in watch.events if e.at * 1e9 >= min(starts))
    return WatchLog(kept) if kept else None


def with_ends_known(traces: TraceSet, ending: Ending) -> TraceSet:
    """``traces`` with each rank's end decided from ``ending``: a rank still running on a lost
    host is lost; a rank that ended abnormally, cleanly with a known time, or not at all after
    the stop was stopped; a rank with no exit record in a job that ended vanished."""
    ranks = dict(traces.ranks)
    stopped_at = ending.stopped_at
    sent = ", then ".join(dict.fromkeys(ending.signals)) or None
    for rank, trace in traces.ranks.items():
        ex = trace.exit
        if ex.kind is ExitKind.RUNNING and rank in ending.lost:
            host, when = ending.lost[rank]
            ranks[rank] = replace(trace, exit=RankExit(ExitKind.LOST, exception=host,
                                                       time_ns=when))
            continue
        if ex.kind is ExitKind.LOST:
            continue
        # a clean exit known to follow the stop is its doing too (a script that catches
        # KeyboardInterrupt or SIGTERM, saves, and returns); one before it is not
        if stopped_at is not None and not (ex.time_ns is not None
                                           and ex.time_ns < stopped_at * 1e9) and (
                ex.abnormal or ex.kind is ExitKind.RUNNING or (
                    ex.kind is ExitKind.CLEAN and ex.time_ns is not None)):
            ranks[rank] = replace(trace, exit=RankExit(ExitKind.STOPPED, signal=sent,
                                                       time_ns=ex.time_ns))
        elif stopped_at is None and ending.stop_unknown and ex.kind is ExitKind.RUNNING:
            ranks[rank] = replace(trace, exit=RankExit(ExitKind.STOPPED))
        elif ending.ended and ex.kind is ExitKind.RUNNING:
            ranks[rank] = replace(trace, exit=RankExit(ExitKind.VANISHED))
    return replace(traces, ranks=ranks)


def behind_peers(traces: TraceSet) -> dict[int, list[tuple[str, int]]]:
    """rank -> the (group, sequence number) of each collective its peers entered after its
    last one in that group: what the rank would have been needed for. A rank whose capture is
    damaged is never behind: its file may have lost the calls its peers went on to."""
    needed: dict[int, list[tuple[str, int]]] = {}
    damaged = traces.damaged_ranks()
    for name, timeline in timelines(traces).items():
        top = max(timeline.last_seq.values(), default=0)
        for rank, last in timeline.last_seq.items():
            if last < top and rank not in damaged:
                needed.setdefault(rank, []).append((name, last + 1))
    return needed


#: what a rank raises when a peer it talks to is gone (gloo, NCCL, torch's c10d)
PEER_LOST = ("Connection closed by peer", "Connection reset by peer", "remote process exited",
             "Broken pipe")


def peer_lost(trace: RankTrace) -> bool:
    """The rank raised because a peer was gone (PEER_LOST's words)."""
    ex = trace.exit
    return ex.kind is ExitKind.EXCEPTION and any(p in (ex.exception or "") for p in PEER_LOST)


def left_before_a_peer_lost_it(traces: TraceSet, needed: dict[int, list[tuple[str, int]]],
                               ) -> dict[int, list[tuple[str, int]]]:
    """Ranks the recorded calls do not show behind (``needed``: behind_peers) that ended -
    destroyed their process group, or exited - before a peer of theirs raised because a peer
    was gone: the call the peer was in when it lost them may be one nothing recorded (DDP's,
    issued from C++). The calls decide first; these times only where they say nothing. rank ->
    the (group, sequence number) the peer was left in."""
    # (a peer that lost them at its own teardown, its group destroyed, had nothing left to do)
    losers = [(t.exit.time_ns, last) for t in traces.ranks.values()
              if peer_lost(t) and t.exit.time_ns is not None and not _destroyed(t)
              for last in (last_leaf(t),) if last is not None]
    if not losers:
        return {}
    lines = timelines(traces)
    out: dict[int, list[tuple[str, int]]] = {}
    for rank, trace in traces.ranks.items():
        if rank in needed or trace.exit.was_running or peer_lost(trace):
            continue
        ended = _ended_at(trace)
        for lost_at, last in losers:
            if ended is None or ended >= lost_at or rank not in traces.group_members(last.group):
                continue
            line = lines.get(last.group)
            mine = line.last_seq.get(rank, 0) if line is not None else 0
            if mine > last.align_seq:
                continue  # it went further than the peer did: not the one that was missed
            out.setdefault(rank, []).append((last.group, max(last.align_seq, mine + 1)))
    return out


#: the notes that say a rank's program came to its end: its process group destroyed, atexit run
ENDED = ("destroyed", "exit")


def program_ended(trace: RankTrace) -> bool:
    """The rank's program came to its end (ENDED), whatever ended the process after."""
    return any(n.get("note") in ENDED for n in trace.notes)


def _ended_at(trace: RankTrace) -> int | None:
    """When the rank let its peers go: its process group destroyed, else its end."""
    times = [n.get("time_ns") for n in trace.notes if n.get("note") in ENDED]
    times = [t for t in times if isinstance(t, int)] + (
        [trace.exit.time_ns] if trace.exit.time_ns is not None else [])
    return min(times) if times else None


def with_finished_marked(traces: TraceSet) -> TraceSet:
    """``traces`` with each vanished rank whose work had finished marked ``FINISHED``."""
    vanished = [r for r, t in traces.ranks.items() if t.exit.kind is ExitKind.VANISHED]
    if not vanished:
        return traces
    needed = behind_peers(traces)
    ranks = dict(traces.ranks)
    for rank in vanished:
        trace = ranks[rank]
        if _destroyed(trace) or (traces.exit_status == 0 and rank not in needed
                                 and blocked_event(trace) is None):
            ranks[rank] = replace(trace, exit=RankExit(ExitKind.FINISHED,
                                                       time_ns=trace.exit.time_ns))
    return replace(traces, ranks=ranks)


def _destroyed(trace: RankTrace) -> bool:
    return any(n.get("note") == "destroyed" for n in trace.notes)


def teardown_abort(trace: RankTrace, needed: bool) -> bool:
    """Killed by a signal with no exception raised and no Python frame running (faulthandler
    found none: interpreter teardown, a C++ destructor), after its last collective completed
    and with no peer needing it: the process died on its way out, its work done."""
    ex, last = trace.exit, last_leaf(trace)
    return (ex.kind is ExitKind.SIGNAL and not ex.exception and ex.callsite is None
            and not needed and blocked_event(trace) is None
            and (last is None or last.state is not EventState.FAILED))


def aborted_at_its_end(trace: RankTrace) -> bool:
    """A teardown abort (``teardown_abort``, whoever waited) after the rank's program had ended
    (analysis/calls/ends.py ``program_ended``): not a crash of its own, as an OOM kill between two
    calls, which leaves no such note, is."""
    return program_ended(trace) and teardown_abort(trace, needed=False)
