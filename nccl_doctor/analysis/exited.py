"""``rank_exited``: a rank ended (clean exit, exception, signal) while its peers still needed it,
or ended abnormally outside any collective."""

from __future__ import annotations

from collections import defaultdict

from nccl_doctor.analysis.align import blocked_event, last_leaf
from nccl_doctor.analysis.ends import behind_peers
from nccl_doctor.analysis.missing import HINT_EXITED
from nccl_doctor.analysis.wording import call_fields, call_name, call_site, fate, ranks_text, site
from nccl_doctor.diagnosis import Finding, FindingKind, Severity
from nccl_doctor.model import EventState, ExitKind, RankTrace, TraceSet

HINT_CRASH = (
    "Fix the error this rank raised; its peers only failed because it was gone. Launch with "
    "torchrun's --max-restarts, or catch the error on every rank alike, to keep ranks in step."
)


HINT_TEARDOWN = (
    "No error was raised: the rank's work had finished (its last collective completed and no "
    "peer needed it) when the process aborted on its way out - typically a C++ destructor "
    "(a process group's threads, a communicator) running at interpreter exit. Call "
    "torch.distributed.destroy_process_group() at the end of the script; if the abort stays, "
    "it lies in the library whose threads outlive the interpreter."
)


def detect_rank_exited(traces: TraceSet) -> list[Finding]:
    needed = behind_peers(traces)  # rank -> [(group, seq needed)]

    groups: dict[tuple, list[int]] = defaultdict(list)
    teardown: list[int] = []
    for rank, trace in sorted(traces.ranks.items()):
        ex = trace.exit
        if ex.was_running or ex.kind is ExitKind.LOST:
            continue  # running, or lost with its host (nccl_doctor/analysis/lost.py)
        last = last_leaf(trace)
        inside = last is not None and last.state in (EventState.ENTERED, EventState.FAILED)
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

    findings = []
    for (kind, code, signal, exception, _site, was_needed), ranks in groups.items():
        trace = traces.ranks[ranks[0]]
        ex = trace.exit
        last = last_leaf(trace)
        detail = [f"{ranks_text(ranks)} {fate(trace)}."]
        if was_needed:
            waits = sorted({g_s for r in ranks for g_s in needed[r]})
            detail.append(
                "Its peers went on to " + ", ".join(f"collective #{s} of group {g}" for g, s in waits)
                + ", which it never entered."
            )
        where = {"callsite": site(ex.callsite)} if ex.callsite else (
            call_fields(last, trace.meta.versions) if last else {})
        title = f"{ranks_text(ranks)} {ex.describe()}"
        if ex.callsite is not None:
            title += f" at {site(ex.callsite)}"
        elif last is not None:
            title += f" after {call_name(last)} at {call_site(last, trace.meta.versions)}"
        if was_needed:
            title += " while its peers still needed it"
        t = ex.time_ns or (last.t_exit_ns or last.t_enter_ns if last else None)
        findings.append(Finding(
            kind=FindingKind.RANK_EXITED, severity=Severity.ERROR, title=title,
            detail="\n".join(detail), ranks=tuple(ranks),
            hint=HINT_EXITED if was_needed and not ex.abnormal else HINT_CRASH,
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
    return findings


def teardown_abort(trace: RankTrace, needed: bool) -> bool:
    """Killed by a signal with no exception raised and no Python frame running (faulthandler
    found none: interpreter teardown, a C++ destructor), after its last collective completed
    and with no peer needing it: the process died on its way out, its work done."""
    ex, last = trace.exit, last_leaf(trace)
    return (ex.kind is ExitKind.SIGNAL and not ex.exception and ex.callsite is None
            and not needed and blocked_event(trace) is None
            and (last is None or last.state is not EventState.FAILED))


def _teardown(traces: TraceSet, ranks: list[int]) -> Finding:
    trace = traces.ranks[ranks[0]]
    last = last_leaf(trace)
    signal = trace.exit.signal or "a signal"
    after = f" after {call_name(last)} completed" if last is not None else ""
    return Finding(
        kind=FindingKind.RANK_EXITED, severity=Severity.WARNING,
        title=f"{ranks_text(ranks)} aborted at teardown ({signal}){after}: its work had "
              "finished and no error was raised",
        detail=f"{ranks_text(ranks)} was killed by {signal} with no exception recorded and no "
               "Python frame running (interpreter teardown), "
               f"after its last collective completed{after and ' (' + call_name(last) + ')'}; "
               "no peer was waiting for it.",
        ranks=tuple(ranks), hint=HINT_TEARDOWN,
        group=last.group if last else None, seq=last.align_seq if last else None,
        op=last.op if last else None,
        evidence={"exit": ExitKind.SIGNAL.value, "signal": trace.exit.signal, "teardown": True},
        time_ns=trace.exit.time_ns,
    )
