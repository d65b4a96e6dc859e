"""The supervisor loop: launch, watch, collect, analyse, report.

While the job runs, ``tick`` takes one ``Snapshot`` of the job
(nccl_doctor/supervisor/watching.py), hands it to every watch (the hang watchdog, the silent-error
check, the straggler sampling), applies what they decide - it alone writes report.json and stops
the job - then calls the listeners (the GPU sampler, a live display). Once the job has ended, the
captures are analysed post mortem; a hang the watchdog diagnosed stays the report's verdict.

Between ticks the loop sleeps (``_sleep``): every ``poll_interval`` while the ranks' counters
move (so that the job's last progress is timed to a tick), otherwise until the soonest look a
watch or listener needs (its ``due``), at most ``MAX_SLEEP``. A job that waits - a long
evaluation on one rank, a checkpoint - is looked at once a second, not five times; the job's
exit wakes the loop at once (a pidfd), and a stop in progress keeps it ticking.

It is a state machine (``State``) over the parts that do the work: the ``Launch`` (the run's
first steps, from the claim of ``--out`` to the launched job, which ``nccl-doctor run`` takes
before it builds the supervisor: start.py), the ``Stopper`` (stopping a job for its hang,
politely first: stopper.py), the ``SignalForwarder`` (what the terminal sends goes on to the
job: signals.py) and, on a multi-node job, the ``Federation`` (this node's part:
federation/node.py, the only door to the other nodes).
"""

from __future__ import annotations

import enum
import os
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Callable, Sequence

from nccl_doctor.analysis import analyze
from nccl_doctor.analysis.attempts import with_attempts
from nccl_doctor.analysis.calls.annotate import Annotator
from nccl_doctor.capture.fault_files import drop_empty_fault_files
from nccl_doctor.capture.manifest import Manifest
from nccl_doctor.capture.names import capture_files, report_path
from nccl_doctor.diagnosis import Diagnosis, Verdict
from nccl_doctor.env import host_name
from nccl_doctor.errors import DoctorError, ExitStatus, LaunchFailed
from nccl_doctor.status_view import LiveView
from nccl_doctor.model import TraceSet
from nccl_doctor.supervisor.federation import Federation, FederatedJob, Rendezvous
from nccl_doctor.supervisor.federation.keys import JobKey
from nccl_doctor.supervisor.gpu.nvml import GpuSource, Nvml
from nccl_doctor.supervisor.gpu.sampler import GpuSampler
from nccl_doctor.supervisor.launch import Job, exit_status
from nccl_doctor.supervisor.watching import Decision, SampleLogs, LiveJob, Report, Watch
from nccl_doctor.supervisor.policy import HangPolicy
from nccl_doctor.supervisor.cluster import Cluster
from nccl_doctor.supervisor.silent_watch import SilentWatch
from nccl_doctor.supervisor.straggler_watch import StragglerWatch
from nccl_doctor.supervisor.signals import CTRL_C_GRACE, outside_end
from nccl_doctor.supervisor.start import Launch, supervisor_entry
from nccl_doctor.supervisor.stopper import Stopper
from nccl_doctor.supervisor.watchdog import Watchdog
from nccl_doctor.watch_log import HangCalled, Interrupted, Stopped, WatchEvent


class State(enum.Enum):
    STARTING = "starting"
    RUNNING = "running"
    ENDED = "ended"
    ANALYSING = "analysing"
    DONE = "done"


_ALLOWED = {
    State.STARTING: {State.RUNNING, State.DONE},
    State.RUNNING: {State.ENDED},
    State.ENDED: {State.ANALYSING},
    State.ANALYSING: {State.DONE},
    State.DONE: set(),
}


@dataclass(frozen=True)
class RunResult:
    exit_status: int
    diagnosis: Diagnosis | None
    report_path: Path | None
    analysis_error: str | None = None
    stopped_orphans: bool = False
    stopped_for_hang: bool = False  # the watchdog stopped the job (--on-hang kill)
    by_user: bool = False  # the user's Ctrl-C ended the job (no report is served on: --serve)


#: The longest the loop sleeps while nothing moves (a watch or listener without ``due`` is
#: looked at this often; a watch without it, every ``poll_interval``).
MAX_SLEEP = 1.0


class Supervisor:
    def __init__(self, command: Sequence[str], out_dir: Path, *, poll_interval: float = 0.2,
                 environ: dict[str, str] | None = None, policy: HangPolicy | None = HangPolicy(),
                 announce: Callable[[str], None] | None = None,
                 gpu: Callable[[], GpuSource] | None = Nvml.open,
                 annotators: Sequence[Annotator] | None = None,
                 rendezvous: Rendezvous | None = None, final_wait: float = 300.0,
                 on_report: Callable[[Diagnosis, TraceSet | None], None] | None = None,
                 cluster: Cluster | None = None, federation_key: JobKey | None = None,
                 launch: Launch | None = None) -> None:
        """``policy`` None runs no watches (post-mortem only); ``announce`` receives the watches'
        events (a hang called, the job stopped) as one-line messages; ``gpu`` opens the GPUs'
        NVML (None: no GPU sampling); ``annotators`` recognise known issues (default: the
        installed ones); ``rendezvous``: where this node meets the other nodes of a multi-node
        job (nccl_doctor/supervisor/federation/); ``final_wait``: how long a node whose job
        ended waits for the others' ends (the leader) or the leader's final report;
        ``on_report``: told each report written, with the captures it was drawn from (the CLI
        draws report.html from them); ``cluster``: the node doctors of a Ray cluster or a Slurm
        allocation (``--ray``, ``srun``: started with the job, ended with it, followers of this
        supervisor); ``federation_key``: the job's key that authenticates what the nodes'
        supervisors exchange, and where it came from (None, or one without a secret:
        unauthenticated); ``launch``: the run's first steps
        (start.py), taken already where the job was launched before this supervisor was built
        (None: ``run`` takes them, for ``command`` in ``out_dir`` with ``environ``)."""
        if launch is None:
            launch = Launch(command, out_dir, environ)
        self.launch = launch
        self.out_dir = out_dir
        self.poll_interval = poll_interval
        self.state = State.STARTING
        self.run_id = launch.run_id
        self.live: LiveJob = (FederatedJob if rendezvous is not None else LiveJob)(
            out_dir, self.run_id, policy, annotators=annotators, announce=announce,
            run_files=launch.files)
        self.final_wait = final_wait
        self.federation: Federation | None = None
        if rendezvous is not None:
            live = self.live
            self.federation = Federation(
                rendezvous, live, host_name(), announce=lambda m: live.announce(m),
                key=federation_key.secret if federation_key else None, key_source=federation_key)
            assert isinstance(live, FederatedJob)
            live.federation = self.federation
        self.cluster = cluster
        self.stopper = Stopper(self.live, self.run_id, self._keep, cluster)
        self._ctrl_c = False  # the user's Ctrl-C came (the job is ended within CTRL_C_GRACE)
        self.stopper.job = launch.job
        launch.stopping = lambda: self.stopper.stopping
        self.signals = launch.signals
        self.on_report = on_report
        self._page_traces: TraceSet | None = None  # what the last report was drawn from
        self._hang_reported = False  # a hang report stands: a suspicion does not replace it
        # the ranks' counters and notes at the last tick, and whether they moved there
        self._seen: tuple[dict[int, int], dict[int, int]] | None = None
        self._moved = True
        self.watches: list[Watch] = []  # handed the snapshot every tick
        self.listeners: list[Callable[[Supervisor], None]] = []  # called every tick after them
        if cluster is not None:
            self.listeners.append(cluster)
        self.watchdog: Watchdog | None = None
        self.silent: SilentWatch | None = None
        self.straggler: StragglerWatch | None = None
        if policy is not None:
            self.watchdog = Watchdog(self.live)
            self.silent = SilentWatch(self.live)
            watchdog = self.watchdog
            self.straggler = StragglerWatch(self.live, lambda: watchdog.hang_suspected)
            self.watches += [self.watchdog, self.silent, self.straggler]
        self.gpu: GpuSampler | None = None
        if gpu is not None:
            live, watchdog_ = self.live, self.watchdog

            def ranks() -> dict[int, tuple[int, int | None]]:  # this host's: its GPUs only
                return {r: (p.pid, p.local_rank) for r, p in live.local().items()}

            fed = self.federation

            def fast() -> bool:  # nothing recorded for a while: a hang may be coming
                if fed is not None and fed.following:  # (its watchdog waits: the leader looks)
                    return fed.still_for() >= (policy.quiet if policy else 1.0)
                return watchdog_ is not None and watchdog_.quiet

            self.gpu = GpuSampler(out_dir, ranks=ranks, open_source=gpu, fast=fast)
            self.listeners.append(self.gpu)
        # what the GPU sampler and the straggler watch write, the captures' reader takes from them
        self.live.captures.beside = SampleLogs(self.gpu.log if self.gpu is not None else None,
                                               self.straggler.log if self.straggler else None)

    def attach(self, listener: Callable[[Supervisor], None],
               announce: Callable[[str], None] | None = None) -> None:
        """Call ``listener`` every tick (a live display); ``announce`` gets the watches'
        events (a hang called, the job stopped) as one-line messages."""
        self.listeners.append(listener)
        if announce is not None:
            self.live.announce = announce

    def view(self) -> LiveView | None:
        """The watchdog's live view of the job (None without a watchdog)."""
        return self.watchdog.view() if self.watchdog is not None else None

    @property
    def stopped_for_hang(self) -> bool:
        """The watchdog had the job stopped (--on-hang kill), here or on the leader's node."""
        return self.stopper.stopping

    def _to(self, new: State) -> None:
        if new not in _ALLOWED[self.state]:
            raise RuntimeError(f"supervisor: {self.state.value} -> {new.value} is not allowed")
        self.state = new

    @property
    def job(self) -> Job | None:
        return self.launch.job

    def run(self) -> RunResult:
        """Run the job under supervision to its end and analyse it, holding ``out_dir`` for
        this run alone (capture/claim.py: another live run's directory is refused)."""
        try:
            return self._run()  # (a launch that fails undoes its steps: Launch.begin)
        finally:
            self.launch.release()

    def _run(self) -> RunResult:
        launch = self.launch
        ended = False
        try:
            job = launch.job or self._launch()
            self.live.captures.manifest = launch.manifest  # held: never read back
            self._to(State.RUNNING)
            if self.cluster is not None:
                self.cluster.start(self)
            while (code := job.poll()) is None:
                self._keep_interrupt()
                self.tick()
                job.wait(self._sleep())  # (returns as soon as the job exits)
            self._keep_interrupt()
            self._keep_outside_end(code)
            if self.cluster is not None:
                self.cluster.end()  # the node doctors end their nodes' jobs, then report
            self._wait_for_nodes()
            ended = True
        except DoctorError:
            self.state = State.DONE
            raise
        finally:
            if not ended:
                launch.signals.restore()
            if self.gpu is not None:
                self.gpu.close()  # its last sample lands before the analysis reads it
        self._to(State.ENDED)
        try:  # (a second Ctrl-C meanwhile kills what the launcher left: SignalForwarder)
            stopped = self._reap(job)
        finally:
            launch.signals.restore()
        job.release()
        drop_empty_fault_files(self.out_dir)  # every rank is gone: none can fault any more
        status = exit_status(code)
        manifest = launch.ended(status)
        self._to(State.ANALYSING)
        stopped_for_hang = self.stopped_for_hang
        if stopped_for_hang:
            status = ExitStatus.HANG_STOPPED
            manifest = replace(manifest, exit_status=status)
        try:
            diagnosis, report, error = self._analyse(manifest)
        finally:
            self.live.captures.close()
            self.live.registry.close()
            if self.cluster is not None:
                self.cluster.close(self.final_wait)
        self._to(State.DONE)
        return RunResult(status, diagnosis, report, error, stopped, stopped_for_hang,
                         self._ctrl_c)

    def _reap(self, job: Job) -> bool:
        """The processes the job's launcher left, stopped: whether there were any. After the
        user's Ctrl-C they are killed when its grace is over."""
        if not self._ctrl_c:
            return job.reap_stragglers()
        cut_at = self.stopper.cut_at
        return job.reap_stragglers(
            max(0.0, cut_at - self.live.clock()) if cut_at is not None else 0.0, kill=True)

    def _launch(self) -> Job:
        """The launch inside the supervisor (the job not launched before it was built): the
        leader of a multi-node job listens, and the cluster's node doctors are prepared, before
        any rank starts."""
        try:
            job = self.launch.begin(self._node_extra(), before_start=self._meet)
        except LaunchFailed:  # nothing ran: nor are node doctors left started for it
            if self.cluster is not None:
                self.cluster.end()
                self.cluster.close(10.0)
            raise
        self.stopper.job = job
        return job

    def _meet(self) -> None:
        if self.federation is not None:
            self.federation.start()
        if self.cluster is not None:
            self.cluster.prepare(self)

    def tick(self) -> None:
        """One look at the job: the snapshot to every watch, their decisions applied, then the
        listeners. A watch or listener that fails is dropped; the job's supervision goes on."""
        self.stopper.tick()
        snap = self.live.snapshot()
        now = (snap.counts, snap.notes)
        self._moved, self._seen = now != self._seen, (dict(snap.counts), dict(snap.notes))
        if self.job is not None:  # new ranks joined the registry: signalled with the job
            self.job.adopt(p.pid for p in self.live.local().values())
        fed = self.federation
        if fed is not None and fed.beating:  # the leader diagnoses: its decisions apply here
            for raw in fed.follow(snap.counts):  # (none without a key: federation/node.py)
                decision, stop_at = fed.decision_of(raw, str(report_path(self.out_dir)))
                self._apply(decision, share=False, stop_at=stop_at)
        watches = [] if fed is not None and fed.following else list(self.watches)
        for watch in watches:
            try:
                decision = watch.look(snap)
            except Exception as err:
                self.watches.remove(watch)
                self.live.announce(f"{watch.what} failed ({err!r}); it is off from here")
                continue
            if decision is not None:
                self._apply(decision)
        for listener in list(self.listeners):
            try:
                listener(self)
            except Exception:  # a display or sampler must never stop the job's supervision
                self.listeners.remove(listener)

    def _sleep(self) -> float:
        """Seconds until the next tick: ``poll_interval`` while the counters move, a stop is
        under way or other nodes are met; otherwise the soonest ``due`` of the watches (a watch
        without one: ``poll_interval``) and listeners (without one: ``MAX_SLEEP``), within
        ``poll_interval`` and ``MAX_SLEEP``."""
        fast = self.poll_interval
        if (self._moved or self.stopper.stopping or self.stopper.cut_at is not None
                or self.federation is not None
                or self.cluster is not None):
            return fast
        now = self.live.clock()
        soonest = MAX_SLEEP
        for part, default in [(w, fast) for w in self.watches] + [
                (listener, MAX_SLEEP) for listener in self.listeners]:
            due = getattr(part, "due", None)
            try:
                soonest = min(soonest, default if due is None else due(now))
            except Exception:  # a watch's own failure is said at its look, not here
                return fast
        return min(MAX_SLEEP, max(fast, soonest))

    def _keep_interrupt(self) -> None:
        """The user's interrupt, kept beside the captures: the ranks' ends that follow are its
        doing, and the analysis diagnoses the job as it was when it came."""
        interrupt = self.signals.take_interrupt()
        if interrupt is None:
            return
        self._keep(interrupt)
        if self.watchdog is not None:
            self.watchdog.interrupted = True
        if interrupt.signals == ("SIGINT",):  # the user at the terminal: the job ends now
            self._ctrl_c = True
            self.stopper.cut_short(CTRL_C_GRACE)
        else:  # a scheduler's: its SIGKILL may follow before the job's end
            self._interrupted_report()

    def _keep_outside_end(self, code: int) -> None:
        """A job ended by a signal sent to its processes and not to nccl-doctor (Slurm's
        ``--signal`` to the steps) is interrupted, as the same signal sent here would be - when
        nothing of nccl-doctor's (a stop, an interrupt forwarded, a hang called) explains it."""
        watch = self.live.run_files.watch_log()
        if watch is not None and any(isinstance(e, (HangCalled, Interrupted, Stopped))
                                     for e in watch.events):
            return
        interrupt = outside_end(code, os.path.basename(self.launch.command[0]))
        if interrupt is not None:
            self._keep(interrupt)

    def _interrupted_report(self) -> None:
        """report.json at once, as the job stands when the interrupt came: a scheduler's
        SIGKILL may follow its SIGTERM within seconds (Slurm's KillWait), before the job's end
        and the post mortem, which then rewrites it. A hang reported stays; a federated node's
        report is its leader's."""
        if self._hang_reported or self.federation is not None:
            return
        try:
            traces = self.live.captures.load()
            diagnosis = analyze(traces, annotators=self.live.annotators,
                                watch=self.live.run_files.watch_log())
            self.live.run_files.write_report(diagnosis)
        except (DoctorError, OSError, ValueError) as err:
            self.live.announce(f"could not write the report of the interrupt ({err}); the "
                               "post mortem writes it at the job's end")
            return
        self._report_written(diagnosis, traces)

    def _keep(self, record: WatchEvent | None = None, decision: Decision | None = None) -> None:
        """Keep what a decision used, and what was done, beside the captures (for replay). A
        disk that fails here costs the replay its evidence, never the supervision."""
        files = self.live.run_files
        try:
            if decision is not None and decision.fr_dumps:
                files.flight_recorder(decision.fr_dumps)
            if decision is not None and decision.stacks:
                files.stacks(decision.stacks)
            if record is not None:
                files.event(record)
        except (OSError, ValueError) as err:
            self.live.announce(f"could not keep the watchdog's evidence ({err}); replay will "
                               "lack it")

    def _apply(self, decision: Decision, share: bool = True,
               stop_at: float | None = None) -> None:
        fed = self.federation
        if fed is not None and fed.leading and decision.report is not None:
            decision = replace(decision, report=replace(decision.report,
                                                        nodes=fed.nodes_section()))
        if share and fed is not None:
            fed.share_decision(decision, str(report_path(self.out_dir)))
        self._keep(decision.record, decision)
        written = None
        if decision.report is not None:
            if decision.kind is Report.HANG:
                self._hang_reported = decision.report.verdict is Verdict.HANG
                written = decision.report
            elif not self._hang_reported:
                written = decision.report
            if written is not None:
                self.live.run_files.write_report(written)
        for message in decision.announce:
            self.live.announce(message)
        if decision.stop_job:
            self.stopper.stop_for_hang(stop_at)
        elif decision.end_ranks:
            self.stopper.end_ranks(decision.rank_pids)
        if written is not None:  # the page after the stop: the job is not kept waiting for it
            self._report_written(written, decision.traces)

    def _report_written(self, diagnosis: Diagnosis, traces: TraceSet | None) -> None:
        """``on_report`` told of a report, with the newest captures seen. One that fails costs
        what it makes (the page), never the supervision."""
        if traces is not None:
            self._page_traces = traces
        if self.on_report is None:
            return
        try:
            self.on_report(diagnosis, self._page_traces)
        except Exception as err:  # noqa: BLE001 - a template or disk failure
            self.live.announce(f"report.html not written ({err})")

    def _wait_for_nodes(self) -> None:
        """This node's job ended. The leader goes on watching the job until every other node's
        has ended too (or is lost, or ``final_wait`` passed): its watches still see theirs."""
        fed = self.federation
        if fed is None or fed.leader is None:
            return
        deadline = self.live.clock() + self.final_wait
        while self.live.clock() < deadline:
            if fed.gather():
                return
            self.tick()
            time.sleep(self.poll_interval)

    def _from_leader(self) -> Diagnosis | None:
        """A follower's final report: the leader's, once it has every node's end."""
        fed = self.federation
        if fed is None:
            return None
        # (one still reaching the leader tries on: Follower.follower_finish)
        return fed.final_from_leader(self.live.registry.poll(), self.final_wait)

    def _analyse(self, manifest: Manifest) -> tuple[Diagnosis | None, Path | None, str | None]:
        """The post mortem, on what the supervisor holds: the captures as its followers read
        them (only their last records read now), its own evidence and decisions; the manifest
        and reports written once each, when what they say is known."""
        fed, files = self.federation, self.live.run_files
        self.live.captures.manifest = manifest  # ended: its exit status is the job's
        try:
            traces = (self.live.union(ended=True) if isinstance(self.live, FederatedJob)
                      else self.live.final())
        except DoctorError as err:
            files.write_manifest(manifest)
            return None, None, str(err)
        hosts = tuple(sorted({t.meta.host for t in traces.ranks.values()}))
        files.write_manifest(replace(
            manifest, world_size=traces.world_size, hosts=hosts,
            captures=tuple(f.name for f in capture_files(self.out_dir)),
            extra=self._node_extra()))
        leader = self._from_leader()
        if leader is not None:  # a follower: the leader's report is this node's too
            if fed is not None:
                fed.close()
            path = files.write_report(leader)
            self._report_written(leader, traces)
            return leader, path, None
        settled = self.watchdog.settle(traces) if self.watchdog is not None else None
        if settled is not None:  # what the backend did to the stuck calls, seen at the end
            self._apply(settled)
        # the watchdog's events as they stand now, the live hang report among them as a value
        diagnosis = analyze(traces, annotators=self.live.annotators, watch=files.watch_log())
        if len(self.live.captures.attempts) > 1:  # a launcher's restarts: the earlier
            # attempts' captures, read now that they are over
            diagnosis = with_attempts(diagnosis, [self.out_dir],
                                      lambda t: analyze(t, annotators=self.live.annotators))
        if fed is not None:
            diagnosis = replace(diagnosis, nodes=fed.nodes_section())
            if not fed.leading and fed.problem:
                diagnosis = replace(diagnosis, notes=diagnosis.notes + (
                    f"this report covers this node's ranks only: {fed.problem}",))
            diagnosis = replace(diagnosis, notes=diagnosis.notes + fed.trust_notes())
            fed.publish_final(diagnosis, wait=10.0)
            fed.close()
        path = files.write_report(diagnosis)
        self._report_written(diagnosis, traces)
        return diagnosis, path, None

    def _node_extra(self) -> dict:
        """The manifest's word on this supervisor (replay of an unfinished run asks whether it
        still runs) and on this node's part in a multi-node job (replay orders the nodes'
        directories by it: the leader's first)."""
        me = supervisor_entry()
        fed = self.federation
        if fed is None:
            return me
        return {**me, "node": fed.manifest_entry()}

