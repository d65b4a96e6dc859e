"""``rank_exited``: a rank ended (clean exit, exception, signal) while its peers still needed it,
or ended abnormally outside any collective; or raised before it joined a process group."""

from __future__ import annotations

import re
from collections import defaultdict

from nccl_doctor.analysis.calls.align import last_leaf
from nccl_doctor.analysis.calls.ends import (
    behind_peers, left_before_a_peer_lost_it, teardown_abort,
)
from nccl_doctor.analysis.what.missing import HINT_EXITED
from nccl_doctor.analysis.calls.setting import Setting, setting_of
from nccl_doctor.analysis.calls.wording import (
    call_fields, call_name, call_site, fate, frames_json, ranks_text, site,
)
from nccl_doctor.diagnosis import Finding, FindingKind, Severity
from nccl_doctor.model import (
    EarlyExit, Event, EventKind, EventState, ExitKind, RankExit, RankTrace, TraceSet,
)
from nccl_doctor.words import pick, ranks_verb

HINT_CRASH = (
    "Fix the error this rank raised; its peers only failed because it was gone. Launch with "
    "torchrun's --max-restarts, or catch the error on every rank alike, to keep ranks in step."
)


HINT_EARLY = (
    "Fix the error it raised: it came before the rank joined the process group (a missing "
    "setting, an import, a path), so a restart raises it again; the other ranks only waited "
    "for it in init_process_group, or were stopped by the launcher."
)

HINT_RENDEZVOUS = (
    "The rank reached init_process_group and gave up waiting for ranks that never joined: "
    "check that every rank of the job starts (the launcher's --nnodes and --nproc-per-node "
    "against WORLD_SIZE) and reaches MASTER_ADDR:MASTER_PORT, and what ended the missing ones "
    "(their own output)."
)

#: The same advice inside one distributed test (analysis/calls/setting.py): no launcher to restart.
HINT_EARLY_TEST = (
    "Fix the error it raised: it came before the rank joined the process group (importing the "
    "test's module, or setting up the process group), so the other ranks only waited for it in "
    "init_process_group."
)
HINT_RENDEZVOUS_TEST = (
    "The rank reached init_process_group and gave up waiting for ranks of the test that never "
    "joined: see what ended them (their errors and tracebacks in the test's failure)."
)


def crash_hint(setting: Setting, ranks: list[int], ex: RankExit, waited: str | None) -> str:
    """The advice for ranks that ended on their own (an exception, a signal): in a job, fix the
    error and keep the ranks in step; in a test (``Setting.TEST``), the exception is the test
    failing on those ranks - ``waited``: the collective their peers waited for them in."""
    if setting is Setting.JOB:
        return HINT_CRASH
    who = ranks_text(ranks)
    kind = (ex.exception or "").split(":", 1)[0].strip() if ex.kind is ExitKind.EXCEPTION else ""
    if kind == "AssertionError":
        text = f"The assertion failed on {who}: fix the test or the code under test"
    elif kind:
        text = f"{who[0].upper()}{who[1:]} raised {kind} in the test: fix the test or the code " \
            "under test"
    else:
        text = f"{who[0].upper()}{who[1:]} {ex.describe()} during the test: find what ended " \
            f"{'it' if len(ranks) == 1 else 'them'}"
    if waited:
        text += (f"; the other ranks waited for {'it' if len(ranks) == 1 else 'them'} in "
                 f"{waited} and failed only because {'it was' if len(ranks) == 1 else 'they were'}"
                 " gone")
    return text + "."


HINT_TEARDOWN = (
    "No error was raised: the rank's work had finished (its last collective completed and no "
    "peer needed it) when the process aborted on its way out - typically a C++ destructor "
    "(a process group's threads, a communicator) running at interpreter exit. Call "
    "torch.distributed.destroy_process_group() at the end of the script; if the abort stays, "
    "it lies in the library whose threads outlive the interpreter."
)


def detect_rank_exited(traces: TraceSet) -> list[Finding]:
    needed = behind_peers(traces)  # rank -> [(group, seq needed)]
    needed.update(left_before_a_peer_lost_it(traces, needed))

    groups: dict[tuple, list[int]] = defaultdict(list)
    teardown: list[int] = []
    for rank, trace in sorted(traces.ranks.items()):
        ex = trace.exit
        if ex.was_running or ex.kind is ExitKind.LOST:
            continue  # running, or lost with its host (nccl_doctor/analysis/what/lost.py)
        last = last_leaf(trace)
        inside = _inside_a_call(trace, last)
        if not ex.abnormal and rank not in needed:
            continue  # a clean exit nobody waited for is how jobs end
        if inside and ex.kind in (ExitKind.EXCEPTION, ExitKind.SIGNAL):
            # An error raised inside a collective (gloo's size check, "connection closed") is
            # the consequence of that collective's problem, which the desync passes report.
            # A rank that vanished there (OOM killer, SIGKILL) may be the cause: keep it.
            continue
        if teardown_abort(trace, rank in needed):
            teardown.append(rank)
            continue
        key = (ex.kind, ex.code, ex.signal, ex.exception, str(ex.callsite), rank in needed)
        groups[key].append(rank)

    setting = setting_of(traces)
    findings = []
    for (kind, code, signal, exception, _site, was_needed), ranks in groups.items():
        trace = traces.ranks[ranks[0]]
        ex = trace.exit
        last = last_leaf(trace)
        detail = [f"{ranks_verb(ranks, fate(trace))}."]
        if was_needed:
            waits = sorted({g_s for r in ranks for g_s in needed[r]})
            detail.append(
                f"{pick(ranks, 'Its', 'Their')} peers went on to "
                + ", ".join(f"collective #{s} of group {g}" for g, s in waits)
                + f", which {pick(ranks, 'it', 'they')} never entered."
            )
        where = {"callsite": site(ex.callsite)} if ex.callsite else (
            call_fields(last, trace.meta.versions) if last else {})
        title = ranks_verb(ranks, ex.describe())
        if ex.callsite is not None:
            title += f" at {site(ex.callsite)}"
        elif last is not None:
            title += f" after {call_name(last)} at {call_site(last, trace.meta.versions)}"
        if was_needed:
            title += (f" while {pick(ranks, 'its', 'their')} peers still needed "
                      f"{pick(ranks, 'it', 'them')}")
        t = ex.time_ns or (last.t_exit_ns or last.t_enter_ns if last else None)
        findings.append(Finding(
            kind=FindingKind.RANK_EXITED, severity=Severity.ERROR, title=title,
            detail="\n".join(detail), ranks=tuple(ranks),
            hint=HINT_EXITED if was_needed and not ex.abnormal else crash_hint(
                setting, ranks, ex, _waited_in(traces, ranks, needed) if was_needed else None),
            group=last.group if last else None, seq=last.align_seq if last else None,
            op=last.op if last else None, **where,
            evidence={
                "exit": kind.value, "exit_code": code, "signal": signal, "exception": exception,
                "last_collective": call_name(last) if last else None,
                "needed_in": [{"group": g, "seq": s} for r in ranks for g, s in needed.get(r, [])],
            },
            time_ns=t,
        ))
    if teardown:
        findings.append(_teardown(traces, teardown))
    return findings + raised_before_joining(traces)


def _inside_a_call(trace: RankTrace, last: Event | None) -> bool:
    """The rank's end came inside its last collective: still in it, or it failed - or in the
    wait of an async one (Work.wait, a functional collective's wait_tensor)."""
    if last is not None and last.state in (EventState.ENTERED, EventState.FAILED):
        return True
    latest = next((e for e in reversed(trace.events) if e.kind in _CALLS), None)
    return (latest is not None and latest.kind is EventKind.WAIT
            and latest.state in (EventState.ENTERED, EventState.FAILED))


_CALLS = (EventKind.COLLECTIVE, EventKind.P2P, EventKind.WAIT)


def _waited_in(traces: TraceSet, ranks: list[int],
               needed: dict[int, list[tuple[str, int]]]) -> str | None:
    """The first collective the peers of ``ranks`` entered without them: ``all_reduce #2
    (group 0)``."""
    for group, seq in sorted({g_s for r in ranks for g_s in needed.get(r, [])},
                             key=lambda g_s: (g_s[1], g_s[0])):
        for rank, trace in sorted(traces.ranks.items()):
            if rank in ranks:
                continue
            call = next((e for e in trace.events if e.kind in _CALLS and e.group == group
                         and e.align_seq == seq), None)
            if call is not None:
                return call_name(call)
        return f"collective #{seq} of group {group}"
    return None


def early_stopped(traces: TraceSet) -> frozenset[int]:
    """Ranks that raised before joining once the job was being stopped (nccl-doctor's stop, or
    the user's Ctrl-C): the stop's doing, as analysis/calls/ends.py decides for recorded ranks."""
    stopped_at = traces.watch.stopped_at if traces.watch is not None else None
    if stopped_at is None:
        return frozenset()
    return frozenset(r for r, e in traces.early_exits.items()
                     if e.time_ns is None or e.time_ns >= stopped_at * 1e9)


def early_causes(traces: TraceSet) -> dict[int, EarlyExit]:
    """The ranks that raised before joining for a reason of their own: those that raised inside
    init_process_group (a rendezvous that timed out) only waited for a peer, unless every one
    did."""
    stopped = early_stopped(traces)
    ended = {r: e for r, e in sorted(traces.early_exits.items()) if r not in stopped}
    return {r: e for r, e in ended.items() if not e.in_init} or ended


def raised_before_joining(traces: TraceSet) -> list[Finding]:
    """A finding per exception that ended ranks before they joined a process group (ranks that
    raised the same at the same line together): no capture of theirs exists, and the job's
    other ranks could only wait for them. Those that timed out in init_process_group meanwhile
    are consequences (diagnose lists them under the root cause)."""
    groups: dict[tuple, list[int]] = defaultdict(list)
    causes = early_causes(traces)
    test = setting_of(traces) is Setting.TEST
    for rank, e in causes.items():
        groups[(first_line(e.exception), e.callsite, e.in_init)].append(rank)
    findings = []
    for (exception, callsite, in_init), ranks in groups.items():
        e = causes[ranks[0]]
        one = len(ranks) == 1
        where = f" at {site(callsite)}" if callsite is not None else ""
        detail = [f"{ranks_text(ranks)} raised {e.exception}{where} before joining a process "
                  f"group (init_process_group had not returned), so {'its' if one else 'their'} "
                  f"capture never existed: how {'it' if one else 'they'} ended is all that "
                  "was recorded."]
        if in_init:
            detail.append(f"{'It' if one else 'They'} raised inside init_process_group: "
                          f"{'it' if one else 'they'} reached the rendezvous, and the ranks "
                          f"{'it' if one else 'they'} waited for never joined.")
        unseen = [r for r in range(traces.world_size) if r not in traces.ranks
                  and r not in traces.early_exits and r not in traces.unrecorded]
        if unseen:
            detail.append(f"{ranks_text(unseen)} left no record: never started, or ended "
                          "without an exception (a signal: the launcher stops the others once "
                          "one rank fails).")
        if e.traceback:
            detail.append("Traceback, innermost first: " + " <- ".join(
                f.text("in") for f in e.traceback))
        connecting = connect_failure(e.exception)
        title = (f"{ranks_text(ranks)} raised {exception}{where} before joining a process group"
                 if connecting is None else
                 f"{ranks_text(ranks)} failed connecting to {'its' if one else 'their'} peers in "
                 f"init_process_group{where}: {connecting}")
        if connecting is not None:
            detail.insert(0, f"The ranks met at the rendezvous, then could not connect to each "
                             f"other: {connecting}." + (
                                 " This was a restart of the job (attempt "
                                 f"{e.attempt[1] + 1} of its launcher): a peer it tried may be "
                                 "an address of the attempt before, gone (torch's gloo "
                                 "restarts are known to fail so)" if e.attempt[1] else ""))
        findings.append(Finding(
            kind=FindingKind.RANK_EXITED, severity=Severity.ERROR,
            title=title,
            detail="\n".join(detail), ranks=tuple(ranks),
            hint=(HINT_RENDEZVOUS_TEST if test else HINT_RENDEZVOUS) if in_init
            else (HINT_EARLY_TEST if test else HINT_EARLY),
            callsite=site(callsite) if callsite is not None else None,
            evidence={
                "exit": ExitKind.EXCEPTION.value, "exception": e.exception,
                "before_joining": True, "in_init_process_group": in_init,
                "pids": {str(r): causes[r].pid for r in ranks},
                "traceback": frames_json(e.traceback),
            },
            time_ns=min((causes[r].time_ns for r in ranks if causes[r].time_ns is not None),
                        default=None),
        ))
    return findings


_MESH = re.compile(r"connectFullMesh|timed out connecting|Connection refused|Connection reset")
_REMOTE = re.compile(r"remote=\[([^\]]{1,100})\]:(\d{1,5})")
_SO_ERROR = re.compile(r"SO_ERROR: ([A-Za-z ]{3,60})")  # the socket's own error, when given
_WHY = re.compile(r"Connection refused|Connection reset by peer|timed out connecting")


def connect_failure(exception: str) -> str | None:
    """What an exception raised while the ranks connected to each other (gloo's full mesh)
    says of it - ``connection refused, connecting to 127.0.0.1:52132`` - or None for any
    other."""
    if not _MESH.search(exception):
        return None
    why = _SO_ERROR.search(exception) or _WHY.search(exception)
    reason = (why.group(why.lastindex or 0)).strip().lower() if why else "could not connect"
    remote = _REMOTE.search(exception)
    return f"{reason}, connecting to {remote.group(1)}:{remote.group(2)}" if remote else reason


def first_line(text: str, limit: int = 160) -> str:
    """An exception as a title says it: its first line, cut to ``limit`` characters."""
    line = text.strip().split("\n", 1)[0]
    return line if len(line) <= limit else line[:limit - 3] + "..."


def _teardown(traces: TraceSet, ranks: list[int]) -> Finding:
    trace = traces.ranks[ranks[0]]
    last = last_leaf(trace)
    signal = trace.exit.signal or "a signal"
    after = f" after {call_name(last)} completed" if last is not None else ""
    return Finding(
        kind=FindingKind.RANK_EXITED, severity=Severity.WARNING,
        title=f"{ranks_text(ranks)} aborted at teardown ({signal}){after}: its work had "
              "finished and no error was raised",
        detail=f"{ranks_verb(ranks, 'was')} killed by {signal} with no exception recorded and no "
               "Python frame running (interpreter teardown), "
               f"after its last collective completed{after and ' (' + call_name(last) + ')'}; "
               "no peer was waiting for it.",
        ranks=tuple(ranks), hint=HINT_TEARDOWN,
        group=last.group if last else None, seq=last.align_seq if last else None,
        op=last.op if last else None,
        evidence={"exit": ExitKind.SIGNAL.value, "signal": trace.exit.signal, "teardown": True},
        time_ns=trace.exit.time_ns,
    )
