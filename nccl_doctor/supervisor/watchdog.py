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
4. a hang is returned to the supervisor as a ``Decision`` at once (report.json, the
   announcement, the policy's action), and retracted the same way if progress resumes.

Its states (``WatchState``) and their allowed transitions are below; what the findings say is
nccl_doctor.analysis.what.hang's (pure).
"""

from __future__ import annotations

import enum
import math
import time
from dataclasses import dataclass, replace
from typing import Any

from nccl_doctor.analysis import analyze
from nccl_doctor.analysis.calls.annotate import versions_of
from nccl_doctor.analysis.what import rendezvous
from nccl_doctor.analysis.what.hang import (
    blocked_peer, hang_diagnosis, idle_stall, stall, stuck_peer,
)
from nccl_doctor.analysis.calls.threads import focused
from nccl_doctor.analysis.calls.situation import Assessment, ProcState, Situation, assess
from nccl_doctor.analysis.calls.wording import call_name, ranks_text
from nccl_doctor.words import ranks_verb
from nccl_doctor.analysis.what.aftermath import stuck_calls_fate
from nccl_doctor.capture import flight_recorder
from nccl_doctor.analysis.what.exited import first_line
from nccl_doctor.capture.early_exit import read_early_exits
from nccl_doctor.capture.joining import read_joinings
from nccl_doctor.env import host_name
from nccl_doctor.capture.names import report_path
from nccl_doctor.diagnosis import Diagnosis, Finding, Verdict
from nccl_doctor.status_view import LiveView
from nccl_doctor.model import EventSource, Joining, TraceSet
from nccl_doctor.stacks.places import Place, PlaceKind, place
from nccl_doctor.stacks.rank_stack import RankStack
from nccl_doctor.supervisor import evidence
from nccl_doctor.supervisor.watching import Decision, LiveJob, Snapshot
from nccl_doctor.supervisor.policy import OnHang
from nccl_doctor.supervisor.probe import proc_state
from nccl_doctor.supervisor.reaper import ranks_of_run
from nccl_doctor.supervisor.view import rank_views
from nccl_doctor.watch_account import WatchAccount
from nccl_doctor.watch_log import Aftermath, HangCalled, Retracted


class WatchState(enum.Enum):
    WATCHING = "watching"  # the job records calls
    LOOKING = "looking"  # nothing recorded for ``policy.quiet`` s: the captures are assessed
    HANG = "hang"  # a hang is called and reported (--on-hang report: progress retracts it)
    STOPPING = "stopping"  # the job is being stopped for the hang (--on-hang kill)


_ALLOWED = {
    WatchState.WATCHING: {WatchState.LOOKING},
    WatchState.LOOKING: {WatchState.WATCHING, WatchState.HANG},
    WatchState.HANG: {WatchState.WATCHING, WatchState.STOPPING},
    WatchState.STOPPING: set(),
}


@dataclass
class _Sample:
    at: float
    cpu: float
    signature: tuple
    stopped: bool


class Watchdog:
    """A watch of the supervisor (``look`` once per tick) over ``job`` (its policy must be set)."""

    what = "watchdog"  # named when it fails (the supervisor drops it then)

    def __init__(self, job: LiveJob) -> None:
        assert job.policy is not None
        self.job, self.policy, self.clock = job, job.policy, job.clock
        self.state = WatchState.WATCHING
        # the user's interrupt came (the supervisor says): the ranks' ends that follow are its
        self.interrupted = False
        self.diagnosis: Diagnosis | None = None  # the standing hang diagnosis, if any
        self.detected_at: float | None = None
        self._counts: dict[int, int] = {}
        self._progress_at = self.clock()
        self._last_look = 0.0
        self._first_seen: dict[tuple, float] = {}  # situation key -> when first seen
        self._samples: dict[int, list[_Sample]] = {}
        self._last_sample = 0.0
        self._last_stacks: dict[int, RankStack] = {}  # the awaited ranks' latest sample
        self._started = self.clock()
        self._assessment: Assessment | None = None  # the last look, while nothing has moved
        self._fr_dumps: dict[int, dict[str, Any]] | None = None  # cached while nothing moves
        self._fr_at = 0.0
        self._fr_signature: tuple | None = None  # what the last pull showed (progress check)
        self._nccl = False  # Flight Recorder has shown NCCL entries
        # the calls the waiting ranks were stuck in when the hang was called: rank -> (group,
        # seq, in flight on the GPU only)
        self._stuck_calls: dict[int, tuple[str, int, bool]] = {}
        self._aftermath: tuple[str, ...] = ()  # what the backend did to them since
        self._attempt: tuple[int, int] = (0, 0)  # the launch attempt watched
        self.message = ""  # the current one-line status ("" while nothing is wrong)
        # the last analysis and Flight Recorder merge, kept while their inputs are the same
        self._analyses: list[tuple[TraceSet, Diagnosis]] = []
        self._merge: tuple[TraceSet, dict, TraceSet] | None = None

    # -- the loop ----------------------------------------------------------------------------
    def _to(self, new: WatchState) -> None:
        if new is self.state:
            return
        if new not in _ALLOWED[self.state]:
            raise RuntimeError(f"watchdog: {self.state.value} -> {new.value} is not allowed")
        self.state = new

    def look(self, snap: Snapshot) -> Decision | None:
        if self.state is WatchState.STOPPING:
            return None  # the supervisor is stopping the job
        now = snap.at
        if snap.attempt != self._attempt:  # a launcher's restart: its ranks watched afresh
            self._attempt = snap.attempt
            if self.state is WatchState.HANG:  # (--on-hang restart ended the hung ones)
                self.diagnosis, self._stuck_calls, self._aftermath = None, {}, ()
            self._counts = dict(snap.counts)
            self._progressed(now)
            return None
        if snap.counts != self._counts:
            self._counts = dict(snap.counts)
            self._fr_dumps, self._fr_signature = None, None  # Python calls moved: pull afresh
            if self.state is WatchState.HANG:  # (the interrupt's ends are not the backend's)
                return None if self.interrupted else self._after_hang(snap, now)
            self._progressed(now)
            return None
        quiet_for, since_look = now - self._progress_at, now - self._last_look
        if quiet_for < self.policy.quiet or since_look < self.policy.look_every:
            return None
        if self.state is WatchState.HANG:
            return None  # already diagnosed; under --on-hang report, keep watching for progress
        self._to(WatchState.LOOKING)
        self._last_look = now
        return self._look(snap, now)

    def due(self, now: float) -> float:
        """Seconds from ``now`` to this watchdog's next look while nothing moves (the
        supervisor's loop sleeps until then): after ``policy.quiet`` without progress, then
        every ``policy.look_every``; none while a called hang stands or the job is stopped
        (progress, which retracts a hang, is seen at the loop's next tick)."""
        if self.state in (WatchState.HANG, WatchState.STOPPING):
            return math.inf
        return max(self._progress_at + self.policy.quiet,
                   self._last_look + self.policy.look_every) - now

    def _look(self, snap: Snapshot, now: float) -> Decision | None:
        if not snap.counts:  # no rank has a capture: they may all wait in the rendezvous
            return self._rendezvous(now)
        traces = snap.traces
        if traces is None:
            return None
        live_analysis = self._analysed(traces)
        procs = self.job.procs()
        a = assess(traces, live_analysis, procs)
        waited = now - self._progress_at
        # On NCCL every call returns on the CPU at once: a rank that looks outside collectives may
        # wait in one on the GPU, which only Flight Recorder's completion state shows.
        nccl = self._nccl or any("nccl" in g.backend for g in traces.groups.values())
        fr_every = self.policy.sample_every if nccl else self._computing_every()
        if a.situation is Situation.COMPUTING and waited < fr_every:
            self._assessment = a
            return None  # a compute phase between collectives: the common case, nothing to do
        if a.situation in (Situation.WAITING_ON_PEERS, Situation.COMPUTING):
            # The ranks outside Python collectives may be inside collectives issued from C++
            # (DDP's gradient all_reduce), which only Flight Recorder sees, or in calls that
            # returned but never completed: merge its entries. A deadlock seen through them is
            # confirmed on a fresh pull, never on a cached one.
            previous = self._assessment
            fresh = previous is not None and previous.situation is Situation.DEADLOCK
            # while peers wait: pulled at the sampling cadence on NCCL (its calls return at
            # once) or when an awaited rank looks idle (blocked, maybe in a C++ collective);
            # a busy one is computing (an evaluation, a checkpoint): the slow cadence
            every = (self.policy.sample_every if a.situation is Situation.WAITING_ON_PEERS
                     and (nccl or self._idle(a.awaited)) else fr_every)
            dumps, moved = self._flight_recorder(a, now, every, fresh)
            if moved:  # C++ collectives completed since the last pull: the job progresses
                self._progressed(now)
                return None
            if dumps:
                traces = self._merged(traces, dumps)
                live_analysis = self._analysed(traces)
                a = assess(traces, live_analysis, procs)
        self._assessment = a
        if a.situation is Situation.COMPUTING and waited < self._computing_every():
            return None  # still a compute phase (on NCCL: Flight Recorder says so too)
        first = self._first_seen.setdefault(a.key, now)
        self._first_seen = {a.key: first}
        if a.situation is Situation.DEADLOCK:
            self._status(f"deadlock suspected: {a.cause.title if a.cause else ''}; confirming")
            unsure = self.job.unsure()  # ranks of a silent node: their last word may be stale
            if unsure:
                self._status(f"deadlock suspected; {unsure}")
            elif now - first >= self.policy.confirm:
                return self._declare(traces, live_analysis, a, waited, a.cause, "deadlock")
        elif a.situation is Situation.WAITING_ON_PEERS:
            return self._watch_peers(traces, live_analysis, a, procs, now, waited)
        elif a.situation is Situation.COMPUTING:
            return self._watch_idle(traces, live_analysis, a, now, waited)
        elif a.situation is Situation.ALL_WAITING:
            if waited >= self.policy.hang_after:
                finding = stall(a, "comm", waited)
                return self._declare(traces, live_analysis, a, waited, finding, "stall")
            self._status(f"every rank is inside {call_name(next(iter(a.waiting.values())))}"
                         f" for {waited:.0f} s: a slow collective so far")
        return None

    def _analysed(self, traces: TraceSet) -> Diagnosis:
        """The passes' findings on ``traces``, worked out once per distinct look: while nothing
        moves, the shared reader hands the same object back and the watchdog's looks cost
        little more than a header read per rank."""
        for seen, diagnosis in self._analyses:
            if seen is traces:
                return diagnosis
        diagnosis = analyze(traces, annotators=self.job.annotators)
        # two kept: a look analyses the captures, then them with Flight Recorder merged
        self._analyses = [(traces, diagnosis)] + self._analyses[:1]
        return diagnosis

    def _merged(self, traces: TraceSet, dumps: dict[int, dict[str, Any]]) -> TraceSet:
        """``traces`` with the Flight Recorder pulls merged in; the previous merge again while
        neither the captures nor the pulls changed (a pull is kept between pulls)."""
        if self._merge is None or self._merge[0] is not traces or self._merge[1] is not dumps:
            self._merge = (traces, dumps, flight_recorder.merge(traces, dumps))
        return self._merge[2]

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
        self._to(WatchState.WATCHING)
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
        # a fresh pull confirms a deadlock: with the calls' stacks, which place the calls issued
        # from C++ in the report (never asked of a job that may be healthy: agent_commands.py)
        self._fr_dumps = self.job.flight_recorder(a.live, self.policy.stack_timeout, fresh)
        # get_backend() says "undefined" for a plain init_process_group(): the entries tell
        self._nccl = self._nccl or flight_recorder.has_nccl(self._fr_dumps)
        signature = flight_recorder.progress_signature(self._fr_dumps)
        moved = self._fr_signature is not None and signature != self._fr_signature
        self._fr_signature = signature
        return self._fr_dumps, moved

    def _sample(self, traces: TraceSet, ranks: tuple[int, ...], procs: dict[int, ProcState],
                now: float, every: float) -> None:
        """A stack and CPU sample of ``ranks``, at most once per ``every`` seconds (of the
        threads that make their collectives: a rank is stuck when that thread is)."""
        if now - self._last_sample < every:
            return
        self._last_sample = now
        stacks = focused(self.job.stacks(ranks, self.policy.stack_timeout), traces)
        now_procs = self.job.procs(ranks)
        for r in ranks:
            proc = now_procs.get(r) or procs.get(r)
            stack = stacks.get(r)
            sig = stack.signature() if stack is not None and stack.threads else ()
            self._samples.setdefault(r, []).append(
                _Sample(now, proc.cpu_seconds if proc else 0.0, sig, bool(proc and proc.stopped))
            )
        self._last_stacks = stacks

    def _watch_idle(self, traces: TraceSet, analysis: Diagnosis, a: Assessment,
                    now: float, waited: float) -> Decision | None:
        """No rank in a collective: a hang only if every rank is idle and unchanged past
        --hang-after (busy ranks are computing: nothing waits on them, nothing to call)."""
        self._sample(traces, a.live, {}, now, self._computing_every())
        stuck = {r: why for r in a.live if (why := self._stuck(r)) is not None}
        if waited >= self.policy.hang_after and len(stuck) == len(a.live):
            return self._declare(traces, analysis, a, waited,
                                 idle_stall(a, stuck, self._last_stacks, waited), "stall")
        if stuck:
            idle = ranks_verb(sorted(stuck), "is idle")
            self._status(f"no collective for {waited:.0f} s; {idle}")
        else:
            self._status("")
        return None

    def _watch_peers(self, traces: TraceSet, analysis: Diagnosis, a: Assessment,
                     procs: dict[int, ProcState], now: float, waited: float) -> Decision | None:
        self._sample(traces, a.awaited, procs, now, self.policy.sample_every)
        blocked = self._blocked_in_torch(a.awaited)
        if blocked is not None and len(blocked) == len(a.awaited):
            # every rank is blocked: the waiting ones in calls, the others in torch's own waits
            # that only a peer can end (a store barrier, a group being made): a deadlock
            finding = blocked_peer(a, blocked, analysis)
            return self._declare(traces, analysis, a, waited, finding, "deadlock")
        if blocked is not None:  # seen in one: sampled again after `confirm`, not a full period
            self._last_sample = min(self._last_sample,
                                    now - self.policy.sample_every + self.policy.confirm)
        stuck = {r: why for r in a.awaited if (why := self._stuck(r)) is not None}
        waiting = ranks_verb(sorted(a.waiting), "waits")
        if stuck:
            workers = {r: self.job.worker_stacks(r, self.policy.stack_timeout)
                       for r in stuck if (p := self._place(r)) is not None
                       and p.kind is PlaceKind.DATALOADER}
            finding = stuck_peer(a, stuck, analysis, self._last_stacks, workers)
            return self._declare(traces, analysis, a, waited, finding, "stuck_peer")
        if waited >= self.policy.hang_after:
            finding = stall(a, "compute", waited)
            return self._declare(traces, analysis, a, waited, finding, "hang_after")
        self._status(f"{waiting} in a collective on {ranks_text(list(a.awaited))} "
                     f"(outside collectives): watching")
        return None

    def _rendezvous(self, now: float) -> Decision | None:
        """Before any capture exists: the ranks that began init_process_group (their joining
        records), and whether they can ever meet. Told different rendezvous, they cannot: a
        hang once that has held for ``confirm`` s. Ranks absent from it while the others wait,
        all on this host, are called after ``--stuck-after`` (they may be slow to start)."""
        joinings = read_joinings(self.job.out_dir)
        if not joinings:
            return None
        # a launcher's restart: its own; a Slurm requeue's launch: never the earlier one's
        latest = max(max(j.attempt for j in joinings.values()), self._attempt)
        joinings = {r: j for r, j in joinings.items() if j.attempt == latest}
        if not joinings:
            return None
        key = tuple(sorted((r, j.pid, j.address, j.world_size) for r, j in joinings.items()))
        first = self._first_seen.setdefault(("rendezvous", key), now)
        self._first_seen = {("rendezvous", key): first}
        held = now - first
        absent = rendezvous.absent_ranks(joinings)
        one_host = len({j.host for j in joinings.values()}) == 1 and all(
            j.local_world_size in (None, j.world_size) for j in joinings.values())
        parted = rendezvous.parted(joinings)
        waited = time.time() - max(j.time_ns for j in joinings.values()) / 1e9
        if parted is not None and held >= self.policy.confirm:
            return self._rendezvous_hang(joinings, parted, held)
        if absent and one_host and waited >= self.policy.stuck_after:
            stacks = self._joining_stacks(joinings)
            places = {r: p for r, s in stacks.items() if (p := place(s)) is not None}
            if all(p.kind is PlaceKind.RENDEZVOUS for p in places.values()):
                # the absent ranks' own processes on this host, where they are instead
                alive = {r: pid for r, pid in ranks_of_run(self.job.run_id).items()
                         if r in absent}
                theirs = evidence.collect_stacks(alive, self.job.run_id,
                                                 timeout=self.policy.stack_timeout) if alive else {}
                at = {r: (pid, place(theirs[r]) if r in theirs else None)
                      for r, pid in alive.items()}
                found = rendezvous.never_joined(joinings, absent, places, waited, at)
                return self._rendezvous_hang(joinings, found, waited, {**stacks, **theirs})
        if absent:
            self._status(f"{ranks_verb(sorted(joinings), 'waits')} in init_process_group for "
                         f"{ranks_text(absent)} ({waited:.0f} s)")
        elif waited >= self.policy.stuck_after:  # the whole world joined, none came out
            return self._stuck_joining(joinings, latest, waited)
        return None

    def _stuck_joining(self, joinings: dict[int, Joining], attempt: tuple[int, int],
                       waited: float) -> Decision:
        """Every rank joined the rendezvous and none returned for ``--stuck-after``: those
        alive are stuck in it; those whose process ended say how (their error before joining,
        read now); all ended, the launcher runs on without them."""
        here = host_name()
        gone = {r for r, j in joinings.items() if j.host == here and not proc_state(j.pid).alive}
        raised, _ = read_early_exits(self.job.out_dir, attempt)
        ended = {r: (f"raised {first_line(raised[r][0].exception, 200)}" if r in raised
                     else rendezvous.ENDED_QUIETLY) for r in sorted(gone)}
        stacks = self._joining_stacks({r: j for r, j in joinings.items() if r not in gone})
        places = {r: p for r, s in stacks.items() if (p := place(s)) is not None}
        found = rendezvous.stuck_joining(joinings, ended, waited, places)
        return self._rendezvous_hang(joinings, found, waited, stacks)

    def _joining_stacks(self, joinings: dict[int, Joining]) -> dict[int, RankStack]:
        return evidence.collect_stacks({r: j.pid for r, j in joinings.items()},
                                       self.job.run_id, timeout=self.policy.stack_timeout)

    def _rendezvous_hang(self, joinings: dict[int, Joining], root: Finding, waited: float,
                         stacks: dict[int, RankStack] | None = None) -> Decision:
        """The rendezvous can never complete: called, with the joining ranks' stacks."""
        if stacks is None:
            stacks = self._joining_stacks(joinings)
        account = WatchAccount(
            situation="rendezvous", how="rendezvous", waited_s=round(waited, 1),
            policy=self.policy.on_hang.value, action=self._action())
        world = max(j.world_size for j in joinings.values())
        before = Diagnosis(verdict=Verdict.HANG, findings=(root,), ranks=(), world_size=world,
                           notes=("no rank has joined a process group yet: what is known is "
                                  "each rank's record of beginning init_process_group and its "
                                  "stack",))
        diagnosis = hang_diagnosis(before, root, stacks, account, {}, self.job.annotators)
        self._stuck_calls = {}
        here = host_name()  # (--on-hang restart ends them: no capture names them yet)
        pids = tuple(j.pid for j in joinings.values() if j.host == here and j.pid > 0)
        return self._called(diagnosis, account, stacks, None, "rendezvous", pids)

    def _place(self, rank: int) -> Place | None:
        """Where ``rank``'s latest sampled stack is (None: no sample)."""
        stack = self._last_stacks.get(rank)
        return place(stack) if stack is not None else None

    def _blocked_in_torch(self, ranks: tuple[int, ...]) -> dict[int, Place] | None:
        """The ranks of ``ranks`` whose last two samples, ``confirm`` s or more apart, both show
        them in the same wait of torch.distributed (a store barrier, a group being made, the
        rendezvous): None when none is in one now."""
        out: dict[int, Place] = {}
        seen = False
        for r in ranks:
            found = self._place(r)
            if found is None or not found.kind.blocked_in_torch:
                continue
            seen = True
            samples = self._samples.get(r, [])
            if len(samples) >= 2 and samples[-1].signature == samples[-2].signature and \
                    samples[-1].at - samples[-2].at >= self.policy.confirm:
                out[r] = found
        return out if seen else None

    def _idle(self, ranks: tuple[int, ...]) -> bool:
        """Any of ``ranks`` used less than ``policy.idle_cpu`` of a core between its last two
        samples (unknown until it has two)."""
        for r in ranks:
            samples = self._samples.get(r, [])
            if len(samples) >= 2:
                prev, last = samples[-2], samples[-1]
                span = last.at - prev.at
                if last.stopped or (span > 0 and
                                    (last.cpu - prev.cpu) / span < self.policy.idle_cpu):
                    return True
        return False

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
                 root: Finding | None, how: str) -> Decision:
        stacks = self.job.stacks(a.live, self.policy.stack_timeout)
        if stacks and root is not None and any(f is root for f in analysis.findings):
            # the branch on the rank is read on the stacks too: a blocked rank's stack goes on
            # out past the user's frame its call path ends at (analysis/who/blame.py)
            analysis = analyze(replace(traces, stacks={**traces.stacks, **stacks}),
                               annotators=self.job.annotators)
            root = next((f for f in analysis.findings if f.same_call(root)), root)
        account = WatchAccount(
            situation=a.situation.value, how=how, waited_s=round(waited, 1),
            policy=self.policy.on_hang.value, action=self._action())
        diagnosis = hang_diagnosis(analysis, root, stacks, account, versions_of(traces),
                                   self.job.annotators, traces)
        via_fr = self._nccl  # on NCCL only Flight Recorder says when a call completed
        self._stuck_calls = {
            r: (e.group, e.seq, via_fr or e.in_flight or e.source is EventSource.FLIGHT_RECORDER)
            for r, e in a.waiting.items()}
        return self._called(diagnosis, account, stacks, traces, a.situation.value)

    def _called(self, diagnosis: Diagnosis, account: WatchAccount,
                stacks: dict[int, RankStack], traces: TraceSet | None,
                situation: str, pids: tuple[int, ...] = ()) -> Decision:
        """The hang is called: held, recorded, announced, and the job stopped under
        --on-hang kill (``_stuck_calls``: the calls the ranks wait in, set before)."""
        kill = self.policy.on_hang is OnHang.KILL
        restart = self.policy.on_hang is OnHang.RESTART
        self._aftermath = ()
        record = HangCalled(account, diagnosis.root_cause,
                            {r: (g, q) for r, (g, q, _) in self._stuck_calls.items()}, diagnosis)
        self._to(WatchState.HANG)
        self.diagnosis = diagnosis
        self.detected_at = self.clock()
        self.message = diagnosis.root_cause.title if diagnosis.root_cause else "hang"
        title = diagnosis.root_cause.title if diagnosis.root_cause else situation
        report = report_path(self.job.out_dir)
        if kill:
            self._to(WatchState.STOPPING)
            said = (f"HANG: {title}", f"stopping the job (--on-hang kill); report: {report}")
        elif restart:  # watched again once the launcher starts them anew (``look``)
            said = (f"HANG: {title}", f"ending the hung ranks for their launcher to restart "
                                      f"them (--on-hang restart); report: {report}")
        else:
            said = (f"HANG: {title}",
                    f"report: {report}; the job is left running (--on-hang report)")
        return Decision(report=diagnosis, announce=said, stop_job=kill, end_ranks=restart,
                        rank_pids=pids, record=record, stacks=stacks, fr_dumps=self._fr_dumps,
                        traces=traces)

    def _action(self) -> str:
        """What the policy does on a hang, as the report says it."""
        return {OnHang.KILL: "stopped the job",
                OnHang.RESTART: "ended the hung ranks for their launcher to restart them"}.get(
                    self.policy.on_hang, "reported")

    def _retract(self, now: float) -> Decision:
        """Progress resumed after a reported hang: the report says so."""
        assert self.diagnosis is not None
        retracted = replace(
            self.diagnosis, verdict=Verdict.SUSPECT,
            notes=self.diagnosis.notes + ("the job made progress again after this hang was "
                                          "reported: it was a long pause, not a deadlock",),
            watchdog=replace(self.diagnosis.watchdog, retracted=True),
        )
        self.diagnosis = None
        self._progressed(now)
        return Decision(report=retracted,
                        announce=("progress resumed: the hang report was retracted",),
                        record=Retracted())

    def _after_hang(self, snap: Snapshot, now: float) -> Decision | None:
        """Calls were recorded after the hang was called: progress only if the calls the ranks
        were stuck in completed. The backend ending them - NCCL's watchdog aborting the
        communicator (``DistBackendError``, SIGABRT), a gloo timeout - is a consequence of the
        hang: it stands, and the report adds what the backend did."""
        traces = snap.traces
        if traces is None:
            return None
        fr: dict[int, dict[str, Any]] = {}
        if any(via_fr for _, _, via_fr in self._stuck_calls.values()):
            fr = self.job.flight_recorder(tuple(self._stuck_calls), self.policy.stack_timeout)
        return self._settle(traces, fr, now)

    def settle(self, traces: TraceSet) -> Decision | None:
        """The job has ended (``traces``: its captures, post mortem): what became of the calls a
        standing hang was called on, which the job may have ended too soon to show live."""
        if self.diagnosis is None or self.stopped_job or self.interrupted:
            return None  # no hang, or nccl-doctor or the user's interrupt ended the calls
        return self._settle(traces, {}, self.clock(), ended=True)

    def _settle(self, traces: TraceSet, fr: dict[int, dict[str, Any]], now: float,
                ended: bool = False) -> Decision | None:
        fate = stuck_calls_fate(traces, self._stuck_calls, fr)
        if fate.aborted:
            new = tuple(w for w in fate.aborted if w not in self._aftermath)
            if not new:
                return None
            self._aftermath += new
            what = ("after the hang was called, the backend ended the stuck collectives: "
                    + "; ".join(new) + " - a consequence of the hang, not progress")
            assert self.diagnosis is not None
            self.diagnosis = replace(self.diagnosis, notes=self.diagnosis.notes + (what,),
                                     watchdog=replace(self.diagnosis.watchdog,
                                                      aftermath=self._aftermath))
            return Decision(report=self.diagnosis, announce=(f"the hang stands: {what}",),
                            record=Aftermath(what), fr_dumps=fr or None)
        if fate.completed and not ended:
            return self._retract(now)
        return None  # the stuck calls are still pending: the hang stands

    @property
    def stopped_job(self) -> bool:
        """The watchdog had the job stopped for its hang (--on-hang kill)."""
        return self.state is WatchState.STOPPING

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
        hosts = self.job.hosts()
        return LiveView(rank_views(self._counts, hosts, self._assessment, set()), phase,
                        self.message, now - self._progress_at, now - self._started)
