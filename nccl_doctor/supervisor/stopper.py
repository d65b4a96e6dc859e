"""Stopping a job the watchdog called a hang on (``--on-hang kill``), politely first: every rank
is asked to exit (status 0, so a launcher ends quietly and restarts nothing); what is still
there after the policy's leave grace gets SIGTERM, and SIGKILL after its kill grace. Each step
is kept as a ``Stopped`` event (the ranks' ends that follow are nccl-doctor's doing)."""

from __future__ import annotations

import os
import signal
from dataclasses import replace
from typing import Callable

from nccl_doctor.processes import started
from nccl_doctor.supervisor.agent_client import request_many
from nccl_doctor.supervisor.cluster import Cluster
from nccl_doctor.supervisor.launch import Job
from nccl_doctor.supervisor.watching import LiveJob
from nccl_doctor.watch_log import EXIT_REQUEST, Stopped, WatchEvent


class Stopper:
    def __init__(self, live: LiveJob, run_id: str, keep: Callable[[WatchEvent], None],
                 cluster: Cluster | None = None) -> None:
        self.live, self.run_id, self.keep, self.cluster = live, run_id, keep, cluster
        self.job: Job | None = None  # set once launched
        self.stopping = False  # the job is being stopped for a hang
        self.term_at: float | None = None  # when a job whose ranks were asked to exit gets SIGTERM
        self.kill_at: float | None = None  # when the job stopped for a hang gets SIGKILL
        self.cut_at: float | None = None  # when what the user's Ctrl-C left gets SIGKILL
        # --on-hang restart: the hung ranks' processes (pid -> start time) and when those still
        # there get SIGKILL
        self.ending: tuple[float, dict[int, float]] | None = None

    def signal(self, sig: int) -> None:
        """``sig`` to the whole job (and, first, to the cluster's other nodes' jobs)."""
        if self.cluster is not None:
            self.cluster.stopping(sig)
        if self.job is not None:
            self.job.signal(sig)

    def stop_for_hang(self, stop_at: float | None = None) -> None:
        """Begin stopping the job (once); ``stop_at``: when the leader began stopping it, for a
        node that follows the leader's decision."""
        if self.stopping:
            return
        self.stopping = True
        stop = Stopped()
        if isinstance(stop_at, (int, float)):
            stop = replace(stop, at=min(float(stop_at), stop.at))
        policy = self.live.policy
        if self._ask_ranks_to_exit():
            self.keep(replace(stop, signals=(EXIT_REQUEST,)))
            self.term_at = self.live.clock() + (policy.leave_grace if policy else 0.0)
        else:
            self._terminate(stop)

    def cut_short(self, grace: float) -> None:
        """The user's Ctrl-C, forwarded already: what of the job is still there after
        ``grace`` gets SIGKILL (a rank blocked in a collective never raises its
        KeyboardInterrupt). Not a stop for a hang: the ranks' ends are the interrupt's."""
        if self.kill_at is None and self.cut_at is None:
            self.cut_at = self.live.clock() + grace

    def end_ranks(self, pids: tuple[int, ...] = ()) -> None:
        """``--on-hang restart``: SIGTERM to this host's ranks, SIGKILL after the kill grace to
        those still there - a failure their launcher restarts them for (an exit request would
        end them with status 0: a launcher that sees success restarts nothing). The launcher
        and the job go on. ``pids``: ranks no capture names yet (stuck joining)."""
        ranks = {pid: t for pid in {*(p.pid for p in self.live.local().values()), *pids}
                 if (t := started(pid)) is not None}
        for pid in ranks:
            _send(pid, signal.SIGTERM)
        policy = self.live.policy
        self.ending = (self.live.clock() + (policy.kill_grace if policy else 0.0), ranks)

    def tick(self) -> None:
        """The next step when its time has come."""
        now = self.live.clock()
        if self.ending is not None and now >= self.ending[0]:
            for pid, at in self.ending[1].items():
                if started(pid) == at:  # (still that process: a pid can be reused)
                    _send(pid, signal.SIGKILL)
            self.ending = None
        if self.term_at is not None and now >= self.term_at:
            self.term_at = None  # the ranks were asked to exit; the launcher is still there
            self._terminate()
        if self.cut_at is not None and now >= self.cut_at:
            self.cut_at = None  # (the interrupt kept explains the ends: no Stopped)
            self.signal(signal.SIGKILL)
        if self.kill_at is not None and now >= self.kill_at:
            self.signal(signal.SIGKILL)  # the grace after SIGTERM is over
            self.kill_at = None
            self.keep(Stopped(("SIGKILL",)))

    def _ask_ranks_to_exit(self) -> bool:
        """Ask every rank of this host to exit (``exit``, status 0): whether all that still run
        agreed. A launcher whose workers all exit 0 ends quietly - torchrun prints no
        ``SignalException`` traceback and restarts nothing - where SIGTERM makes it do both.
        Every rank is first told the stop is coming (``quiet``): one that is still blocked in a
        collective when a peer has left then ends silently too, not with a traceback."""
        ranks = {r: p.pid for r, p in self.live.local().items() if started(p.pid) is not None}
        if not ranks or self.job is None:
            return False

        def agreed(replies: dict) -> bool:
            return all(isinstance(reply, dict) and reply.get("ok") is True
                       or started(ranks[rank]) is None for rank, reply in replies.items())

        if not agreed(request_many(self.run_id, ranks, "quiet", timeout=2.0)):
            return False
        replies = request_many(self.run_id, ranks, "exit", timeout=2.0, code=0)
        for reply in replies.values():  # the ranks' children: signalled, reaped with the job
            if isinstance(reply, dict) and isinstance(reply.get("children"), list):
                self.job.adopt(p for p in reply["children"] if isinstance(p, int))
        return agreed(replies)

    def _terminate(self, stop: Stopped | None = None) -> None:
        """SIGTERM to the whole job, SIGKILL after the policy's grace."""
        self.signal(signal.SIGTERM)
        self.keep(replace(stop or Stopped(), signals=("SIGTERM",)))
        policy = self.live.policy
        self.kill_at = self.live.clock() + (policy.kill_grace if policy else 0.0)


def _send(pid: int, sig: int) -> None:
    try:
        os.kill(pid, sig)
    except OSError:  # gone meanwhile, or not ours
        pass
