"""Stragglers while the job runs: what the late rank does while its peers wait for it.

Every ``every`` seconds (longer when a look is slow: at most 5% of the supervisor's time goes to
them), if the job progressed, the supervisor reads the captures and runs the straggler pass. When it names late ranks and, at that moment, some peer waits inside a collective
while the late rank is outside any, the late rank's stack is sampled (py-spy ``--nonblocking``:
the rank is never paused; else its in-rank agent) into ``stragglers.jsonl``. The post-mortem
straggler finding then says where the late rank spends the time its peers wait. Never a hang:
hangs are the watchdog's; this watch stands aside while it suspects one.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any, Callable

from nccl_doctor.analysis.align import blocked_event
from nccl_doctor.analysis.straggler import detect_straggler
from nccl_doctor.capture.directory import load_capture_dir
from nccl_doctor.errors import DoctorError
from nccl_doctor.stacks.samples import SampleLog, StackSample
from nccl_doctor.watchdog import evidence
from nccl_doctor.watchdog.watchdog import Watchdog


DUTY = 20.0  # wait at least this many times a look's own duration before the next one


class StragglerWatch:
    """``Supervisor`` listener; uses the watchdog's registry and policy."""

    def __init__(self, out_dir: Path, watchdog: Watchdog, *, every: float = 10.0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.out_dir, self.watchdog, self.every, self.clock = out_dir, watchdog, every, clock
        self.log = SampleLog(out_dir)
        self._last = clock()
        self._cost = 0.0  # how long the last look took
        self._seen: dict[int, int] = {}

    def __call__(self, _supervisor: Any = None) -> None:
        try:
            self.tick()
        except Exception as err:  # never take the supervisor down
            self.watchdog.announce(f"straggler sampling failed ({err!r}); it is off from here")
            self.tick = lambda: None  # type: ignore[method-assign]

    def tick(self) -> None:
        now = self.clock()
        # a look reads every capture: at most 5% of the supervisor's time goes to them
        if now - self._last < max(self.every, DUTY * self._cost):
            return
        self._last = now
        try:
            self._look()
        finally:
            self._cost = self.clock() - now

    def _look(self) -> None:
        counts = self.watchdog.counts
        if counts == self._seen or self.watchdog.suspicious:
            return  # nothing new, or a hang is being watched
        self._seen = dict(counts)
        before = self.watchdog.registry.poll()  # before the read that says who waits
        try:
            traces = load_capture_dir(self.out_dir, job_ended=False)
        except DoctorError:
            return
        late = {r for f in detect_straggler(traces) for r in f.ranks}
        blocked = {r for r, t in traces.ranks.items() if blocked_event(t) is not None}
        waiting = tuple(sorted(blocked - late))
        targets = {r: p.pid for r, p in self.watchdog.registry.ranks.items()
                   if r in late and r not in blocked and not self.log.full(r)}
        if not waiting or not targets:
            return
        stacks = evidence.collect_stacks(targets, self.watchdog.run_id,
                                         timeout=self.watchdog.policy.stack_timeout)
        after = self.watchdog.registry.poll()
        for rank, stack in sorted(stacks.items()):
            where = evidence.user_frames(stack)
            # a rank that recorded a call since the read reached the collective before the
            # sample was taken: where it was while its peers waited is not known
            if where and before.get(rank) == after.get(rank):
                self.log.add(StackSample(time.time(), rank, where, waiting, stack.source))
