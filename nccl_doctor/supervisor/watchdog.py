"""The live watchdog: turns looks at a running job into a hang diagnosis, within seconds.

It runs in the supervisor (``Supervisor.tick``), outside the job, and never touches the job
except to read its captures, sample its processes (psutil, py-spy, the in-rank agent) and, under
``--on-hang kill``, stop it. Its loop:

1. every tick, read each rank's progress counter (the capture header: 8 bytes per rank);
2. once nothing has moved for ``quiet`` seconds, read the captures and ``assess`` the job;
3. a deadlock (every live rank waits, a desync explains it) that holds, unchanged, for
   ``confirm`` seconds is a hang at once; ranks waiting on peers that are outside collectives make
   those peers suspects: their stacks and CPU are sampled, and a peer that is stopped, or idle with
   an unchanged stack for ``stuck_after`` seconds, makes it a hang - a busy peer or a moving stack
   does not (a checkpoint, an evaluation); any wait past ``hang_after`` is a hang;
4. a hang is written to report.json at once (and rewritten if progress resumes), announced, and
   the policy applied.
"""

from __future__ import annotations

import signal
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Callable

from nccl_doctor.analysis import analyze
from nccl_doctor.analysis.wording import call_name, call_site, ranks_text
from nccl_doctor.capture import flight_recorder
from nccl_doctor.capture.directory import REPORT_JSON, load_capture_dir
from nccl_doctor.diagnosis import Diagnosis, Finding, FindingKind, Severity, Verdict
from nccl_doctor.errors import DoctorError
from nccl_doctor.model import TraceSet
from nccl_doctor.plugins import known_issues
from nccl_doctor.reporters.json import write_report
from nccl_doctor.stacks.rank_stack import RankStack
from nccl_doctor.supervisor import evidence
from nccl_doctor.analysis.situation import Assessment, ProcState, Situation, assess
from nccl_doctor.supervisor.policy import HangPolicy, OnHang
from nccl_doctor.supervisor.probe import Registry, proc_state
from nccl_doctor.supervisor.view import LiveView, rank_views

HINT_STUCK = (
    "The waiting ranks can only go on once the stuck rank reaches the same collective. Its stack "
    "shows where it is: an input pipeline or a lock that never returns, a stopped process, or a "
    "branch taken on that rank only that skips the collective."
)
HINT_STALL_COMM = (
    "Every rank is inside the same collective and none returns: the transport is stuck, not the "
    "program. Check the network/NCCL (NCCL_DEBUG=INFO), a dead peer host, or a GPU that stopped "
    "responding."
)
HINT_STALL_IDLE = (
    "No rank has recorded a call for longer than --hang-after and every rank sits idle at the "
    "same place: typically a dataloader or a lock that never returns, or an input() on a rank. "
    "The stacks show where."
)
HINT_STALL_COMPUTE = (
    "The waiting ranks need a peer that has been computing for longer than --hang-after. If that "
    "is expected (a long evaluation or checkpoint on one rank), raise --hang-after; otherwise the "
    "stack shows the loop it is in."
)


@dataclass
class _Sample:
    at: float
    cpu: float
    signature: tuple
    stopped: bool


class Watchdog:
    """``Supervisor`` listener. ``stop_job(sig)`` signals the whole job; ``announce`` prints."""

    def __init__(self, out_dir: Path, run_id: str, policy: HangPolicy, *,
                 stop_job: Callable[[int], None], announce: Callable[[str], None] | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.out_dir, self.run_id, self.policy = out_dir, run_id, policy
        self.stop_job, self.announce, self.clock = stop_job, announce or (lambda _m: None), clock
        self.registry = Registry(out_dir)
        self.diagnosis: Diagnosis | None = None  # the standing hang diagnosis, if any
        self.stopped_job = False
        self.detected_at: float | None = None
        self._counts: dict[int, int] = {}
        self._progress_at = clock()
        self._last_look = 0.0
        self._first_seen: dict[tuple, float] = {}  # situation key -> when first seen
        self._samples: dict[int, list[_Sample]] = {}
        self._last_sample = 0.0
        self._last_stacks: dict[int, RankStack] = {}  # the awaited ranks' latest sample
        self._kill_at: float | None = None
        self._started = clock()
        self._assessment: Assessment | None = None  # the last look, while nothing has moved
        self._fr_dumps: dict[int, dict[str, Any]] | None = None  # cached while nothing moves
        self._fr_at = 0.0
        self._fr_signature: tuple | None = None  # what the last pull showed (progress check)
        self._nccl = False  # Flight Recorder has shown NCCL entries
        self.message = ""  # the current one-line status ("" while nothing is wrong)

    # -- the loop ----------------------------------------------------------------------------
    def __call__(self, _supervisor: Any = None) -> None:
        try:
            self.tick()
        except Exception as err:  # the watchdog must never take the supervisor down
            self._say(f"watchdog error ({err!r}); the job goes on, unwatched from here")
            self.tick = lambda: None  # type: ignore[method-assign]

    def tick(self) -> None:
        now = self.clock()
        if self._kill_at is not None:
            if now >= self._kill_at:
                self.stop_job(signal.SIGKILL)
                self._kill_at = None
            return
        counts = self.registry.poll()
        if counts != self._counts:
            self._counts = counts
            self._progressed(now)
            self._fr_dumps, self._fr_signature = None, None  # Python calls moved: pull afresh
            if self.diagnosis is not None and not self.stopped_job:
                self._retract()
            return
        quiet_for, since_look = now - self._progress_at, now - self._last_look
        if quiet_for < self.policy.quiet or since_look < self.policy.look_every:
            return
        if self.diagnosis is not None:
            return  # already diagnosed; under --on-hang report, keep watching for progress
        self._last_look = now
        self._look(now)

    def _look(self, now: float) -> None:
        try:
            traces = load_capture_dir(self.out_dir, job_ended=False)
        except DoctorError:
            return
        live_analysis = analyze(traces)
        procs = {r: proc_state(p.pid) for r, p in self.registry.ranks.items()}
        a = assess(traces, live_analysis, procs)
        waited = now - self._progress_at
        # On NCCL every call returns on the CPU at once: a rank that looks outside collectives may
        # wait in one on the GPU, which only Flight Recorder's completion state shows.
        nccl = self._nccl or any("nccl" in g.backend for g in traces.groups.values())
        fr_every = self.policy.sample_every if nccl else self._computing_every()
        if a.situation is Situation.COMPUTING and waited < fr_every:
            self._assessment = a
            return  # a compute phase between collectives: the common case, nothing to do
        if a.situation in (Situation.WAITING_ON_PEERS, Situation.COMPUTING):
            # The ranks outside Python collectives may be inside collectives issued from C++
            # (DDP's gradient all_reduce), which only Flight Recorder sees, or in calls that
            # returned but never completed: merge its entries. A deadlock seen through them is
            # confirmed on a fresh pull, never on a cached one.
            previous = self._assessment
            fresh = previous is not None and previous.situation is Situation.DEADLOCK
            every = (self.policy.sample_every if a.situation is Situation.WAITING_ON_PEERS
                     else fr_every)
            dumps, moved = self._flight_recorder(a, now, every, fresh)
            if moved:  # C++ collectives completed since the last pull: the job progresses
                self._progressed(now)
                return
            if dumps:
                traces = flight_recorder.merge(traces, dumps)
                live_analysis = analyze(traces)
                a = assess(traces, live_analysis, procs)
        self._assessment = a
        if a.situation is Situation.COMPUTING and waited < self._computing_every():
            return  # still a compute phase (on NCCL: Flight Recorder says so too)
        first = self._first_seen.setdefault(a.key, now)
        self._first_seen = {a.key: first}
        if a.situation is Situation.DEADLOCK:
            self._status(f"deadlock suspected: {a.cause.title if a.cause else ''}; confirming")
            if now - first >= self.policy.confirm:
                self._declare(traces, live_analysis, a, waited, a.cause, "deadlock")
        elif a.situation is Situation.WAITING_ON_PEERS:
            self._watch_peers(traces, live_analysis, a, procs, now, waited)
        elif a.situation is Situation.COMPUTING:
            self._watch_idle(traces, live_analysis, a, now, waited)
        elif a.situation is Situation.ALL_WAITING:
            if waited >= self.policy.hang_after:
                finding = _stall(a, "comm", waited)
                self._declare(traces, live_analysis, a, waited, finding, "stall")
            else:
                self._status(f"every rank is inside {call_name(next(iter(a.waiting.values())))}"
                             f" for {waited:.0f} s: a slow collective so far")

    @property
    def counts(self) -> dict[int, int]:
        """Each rank's recorded calls so far (as of the last tick)."""
        return self._counts

    @property
    def quiet(self) -> bool:
        """Nothing recorded for ``policy.quiet`` seconds (the watchdog is looking), or a hang is
        called."""
        return self.diagnosis is not None or self.clock() - self._progress_at >= self.policy.quiet

    @property
    def hang_suspected(self) -> bool:
        """A hang is called, or every rank waits (a deadlock being confirmed, or a stall)."""
        a = self._assessment
        return self.diagnosis is not None or (
            a is not None and a.situation in (Situation.DEADLOCK, Situation.ALL_WAITING))

    def _progressed(self, now: float) -> None:
        """The job moved: whatever was being watched starts over."""
        self._progress_at, self.message = now, ""
        self._first_seen.clear()
        self._samples.clear()
        self._assessment = None

    def _computing_every(self) -> float:
        """Sampling period while no rank is in a collective: slow, since nothing waits."""
        return max(self.policy.sample_every, self.policy.hang_after / 20)

    def _flight_recorder(self, a: Assessment, now: float, every: float,
                         fresh: bool = False) -> tuple[dict[int, dict[str, Any]], bool]:
        """(every live rank's Flight Recorder dump, whether they moved since the previous pull),
        pulled at most once per ``every`` seconds unless ``fresh``."""
        if self._fr_dumps is not None and not fresh and now - self._fr_at < every:
            return self._fr_dumps, False
        self._fr_at = now
        self._fr_dumps = evidence.flight_recorder_dumps(
            {r: self.registry.ranks[r].pid for r in a.live if r in self.registry.ranks},
            self.run_id, timeout=self.policy.stack_timeout,
        )
        # get_backend() says "undefined" for a plain init_process_group(): the entries tell
        self._nccl = self._nccl or flight_recorder.has_nccl(self._fr_dumps)
        signature = flight_recorder.progress_signature(self._fr_dumps)
        moved = self._fr_signature is not None and signature != self._fr_signature
        self._fr_signature = signature
        return self._fr_dumps, moved

    def _sample(self, ranks: tuple[int, ...], procs: dict[int, ProcState], now: float,
                every: float) -> None:
        """A stack and CPU sample of ``ranks``, at most once per ``every`` seconds."""
        if now - self._last_sample < every:
            return
        self._last_sample = now
        pids = {r: self.registry.ranks[r].pid for r in ranks if r in self.registry.ranks}
        stacks = evidence.collect_stacks(pids, self.run_id, timeout=self.policy.stack_timeout)
        for r in ranks:
            proc = proc_state(pids[r]) if r in pids else procs.get(r)
            stack = stacks.get(r)
            sig = stack.signature() if stack is not None and stack.threads else ()
            self._samples.setdefault(r, []).append(
                _Sample(now, proc.cpu_seconds if proc else 0.0, sig, bool(proc and proc.stopped))
            )
        self._last_stacks = stacks

    def _watch_idle(self, traces: TraceSet, analysis: Diagnosis, a: Assessment,
                    now: float, waited: float) -> None:
        """No rank in a collective: a hang only if every rank is idle and unchanged past
        --hang-after (busy ranks are computing: nothing waits on them, nothing to call)."""
        self._sample(a.live, {}, now, self._computing_every())
        stuck = {r: why for r in a.live if (why := self._stuck(r)) is not None}
        if waited >= self.policy.hang_after and len(stuck) == len(a.live):
            self._declare(traces, analysis, a, waited, _idle_stall(a, stuck, self._last_stacks,
                                                                   waited), "stall")
        elif stuck:
            self._status(f"no collective for {waited:.0f} s; {ranks_text(sorted(stuck))} idle")
        else:
            self._status("")

    def _watch_peers(self, traces: TraceSet, analysis: Diagnosis, a: Assessment,
                     procs: dict[int, ProcState], now: float, waited: float) -> None:
        self._sample(a.awaited, procs, now, self.policy.sample_every)
        stuck = {r: why for r in a.awaited if (why := self._stuck(r)) is not None}
        waiting = ranks_text(sorted(a.waiting))
        if stuck:
            finding = _stuck_peer(a, stuck, analysis, self._last_stacks)
            self._declare(traces, analysis, a, waited, finding, "stuck_peer")
        elif waited >= self.policy.hang_after:
            finding = _stall(a, "compute", waited)
            self._declare(traces, analysis, a, waited, finding, "hang_after")
        else:
            self._status(f"{waiting} wait in a collective on {ranks_text(list(a.awaited))} "
                         f"(outside collectives): watching")

    def _stuck(self, rank: int) -> str | None:
        """Why ``rank`` is stuck, from its samples since the situation began; None if not."""
        samples = self._samples.get(rank, [])
        if len(samples) < 2:
            return None
        last = samples[-1]
        if last.stopped and samples[-2].stopped:
            return "its process is stopped (SIGSTOP or a debugger)"
        # the window: the latest run of samples with the same stack
        start = len(samples) - 1
        while start > 0 and samples[start - 1].signature == last.signature:
            start -= 1
        first = samples[start]
        span = last.at - first.at
        if not last.signature or span < self.policy.stuck_after:
            return None
        cpu_share = (last.cpu - first.cpu) / span if span > 0 else 0.0
        if cpu_share >= self.policy.idle_cpu:
            return None  # busy: computing, not stuck
        return f"idle ({cpu_share:.0%} CPU) with an unchanged stack for {span:.0f} s"

    # -- the verdict -------------------------------------------------------------------------
    def _declare(self, traces: TraceSet, analysis: Diagnosis, a: Assessment, waited: float,
                 root: Finding | None, how: str) -> None:
        pids = {r: self.registry.ranks[r].pid for r in a.live if r in self.registry.ranks}
        stacks = evidence.collect_stacks(pids, self.run_id, timeout=self.policy.stack_timeout)
        diagnosis = hang_diagnosis(analysis, root, stacks, {
            "situation": a.situation.value, "how": how, "waited_s": round(waited, 1),
            "policy": self.policy.on_hang.value,
            "action": "stopped the job" if self.policy.on_hang is OnHang.KILL else "reported",
        }, known_issues.versions_of(traces))
        self.diagnosis = diagnosis
        self.detected_at = self.clock()
        self.message = diagnosis.root_cause.title if diagnosis.root_cause else "hang"
        self._write(diagnosis)
        title = diagnosis.root_cause.title if diagnosis.root_cause else a.situation.value
        self._say(f"HANG: {title}")
        if self.policy.on_hang is OnHang.KILL:
            self._say(f"stopping the job (--on-hang kill); report: {self.out_dir / REPORT_JSON}")
            self.stopped_job = True
            self.stop_job(signal.SIGTERM)
            self._kill_at = self.clock() + self.policy.kill_grace
        else:
            self._say(f"report: {self.out_dir / REPORT_JSON}; the job is left running "
                      "(--on-hang report)")

    def _retract(self) -> None:
        """Progress resumed after a reported hang: the report says so."""
        assert self.diagnosis is not None
        retracted = replace(
            self.diagnosis, verdict=Verdict.SUSPECT,
            notes=self.diagnosis.notes + ("the job made progress again after this hang was "
                                          "reported: it was a long pause, not a deadlock",),
            watchdog={**self.diagnosis.watchdog, "retracted": True},
        )
        self._write(retracted)
        self._say("progress resumed: the hang report was retracted")
        self.diagnosis = None

    def final(self, post_mortem: Diagnosis | None) -> Diagnosis | None:
        """The report to keep once the job has ended: a standing hang outranks what followed."""
        if self.diagnosis is None:
            return post_mortem
        note = ("nccl-doctor stopped the job after diagnosing the hang (--on-hang kill)"
                if self.stopped_job else "the job ended after the hang was diagnosed")
        status = post_mortem.exit_status if post_mortem is not None else None
        return replace(self.diagnosis, exit_status=status, notes=self.diagnosis.notes + (note,))

    def _write(self, diagnosis: Diagnosis) -> None:
        write_report(diagnosis, self.out_dir / REPORT_JSON)

    def _status(self, message: str) -> None:
        """The current situation, for the live display (not announced: it changes often)."""
        self.message = message

    def view(self) -> LiveView:
        """What the live status shows now."""
        now = self.clock()
        if self.diagnosis is not None:
            phase = "hang"
        elif not self._counts:
            phase = "starting"
        elif self._assessment is not None:
            phase = self._assessment.situation.value
            if self._assessment.situation is Situation.NO_RANKS:
                phase = "ended"  # every rank that joined has exited
        else:
            phase = "running"
        hosts = {r: p.host for r, p in self.registry.ranks.items()}
        return LiveView(rank_views(self._counts, hosts, self._assessment, set()), phase,
                        self.message, now - self._progress_at, now - self._started)

    def _say(self, message: str) -> None:
        self.announce(message)


# -- building the diagnosis (pure) -----------------------------------------------------------
def hang_diagnosis(analysis: Diagnosis, root: Finding | None, stacks: dict[int, RankStack],
                   watch: dict[str, Any], versions: dict[str, str] | None = None) -> Diagnosis:
    """The hang report: ``root`` first, the stacks, the watchdog's account; known issues
    matched again now that the stacks show which library's code each rank is in."""
    findings = list(analysis.findings)
    if root is not None:
        findings = [replace(root, root_cause=True)] + [
            replace(f, root_cause=False) for f in findings
            if not (f.kind is root.kind and f.group == root.group and f.seq == root.seq)
        ]
    ranks = tuple(
        replace(r, stack_summary=evidence.stack_summary(stacks[r.rank]))
        if r.rank in stacks else r
        for r in analysis.ranks
    )
    hang = replace(analysis, verdict=Verdict.HANG, findings=tuple(findings), ranks=ranks,
                   stack_classes=tuple(evidence.stack_classes(stacks)), watchdog=watch)
    return known_issues.annotate(hang, versions or {})


def _stuck_peer(a: Assessment, stuck: dict[int, str], analysis: Diagnosis,
                stacks: dict[int, RankStack]) -> Finding:
    """missing_collective, with what the stuck ranks are doing instead (from their stacks)."""
    base = next((f for f in analysis.findings if f.kind is FindingKind.MISSING_COLLECTIVE
                 and set(f.ranks) & set(stuck)), None)
    lines = []
    for r, why in sorted(stuck.items()):
        where = evidence.user_frame(stacks[r]) if r in stacks else None
        source = stacks[r].source if r in stacks else "-"
        lines.append(f"rank {r} is stuck outside any collective at {where or '?'}: {why} "
                     f"(stack from {source}).")
    if base is not None:
        return replace(base, detail=base.detail + "\n" + "\n".join(lines), hint=HINT_STUCK,
                       evidence={**base.evidence, "stuck": {str(r): w for r, w in stuck.items()}})
    e = next(iter(a.waiting.values()))
    return Finding(
        kind=FindingKind.MISSING_COLLECTIVE, severity=Severity.ERROR,
        title=f"{ranks_text(sorted(a.waiting))} wait in {call_name(e)}; "
              f"{ranks_text(sorted(stuck))} never came",
        detail="\n".join(lines), ranks=tuple(sorted(stuck)), hint=HINT_STUCK, group=e.group,
        seq=e.align_seq, op=e.op, callsite=call_site(e),
        evidence={"stuck": {str(r): w for r, w in stuck.items()}}, time_ns=e.t_enter_ns,
    )


def _idle_stall(a: Assessment, stuck: dict[int, str], stacks: dict[int, RankStack],
                waited: float) -> Finding:
    lines = [f"rank {r} at {evidence.user_frame(stacks[r]) if r in stacks else '?'}: {why}"
             for r, why in sorted(stuck.items())]
    return Finding(
        kind=FindingKind.STALL, severity=Severity.ERROR,
        title=f"stall (compute): no rank has recorded a call for {waited:.0f} s and every rank "
              "is idle outside collectives",
        detail="\n".join(lines), ranks=a.live, hint=HINT_STALL_IDLE,
        evidence={"class": "compute", "idle": True, "waited_s": round(waited, 1),
                  "stuck": {str(r): w for r, w in stuck.items()}},
    )


def _stall(a: Assessment, kind: str, waited: float) -> Finding:
    e = min(a.waiting.values(), key=lambda ev: ev.t_enter_ns)
    if kind == "comm":
        title = (f"stall (comm): every rank has been inside {call_name(e)} for {waited:.0f} s "
                 "and none returns")
        culprits, hint = tuple(sorted(a.waiting)), HINT_STALL_COMM
    else:
        title = (f"stall (compute): {ranks_text(sorted(a.waiting))} have waited {waited:.0f} s in "
                 f"{call_name(e)} for {ranks_text(list(a.awaited))}, busy outside collectives")
        culprits, hint = a.awaited, HINT_STALL_COMPUTE
    return Finding(
        kind=FindingKind.STALL, severity=Severity.ERROR, title=title,
        detail=f"no rank has recorded a new call for {waited:.0f} s (--hang-after).",
        ranks=culprits, hint=hint, group=e.group, seq=e.align_seq, op=e.op,
        callsite=call_site(e), evidence={"class": kind, "waited_s": round(waited, 1)},
        time_ns=e.t_enter_ns,
    )
