"""Run a test function in ``world_size`` ranks (``spawn``: torch's environment contract on a free
loopback port, without torchrun's agent) under the recorder and the watchdog, and say what
happened."""

from __future__ import annotations

import io
import json
import os
import pickle
import signal
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from nccl_doctor.analysis.calls.wording import ranks_text
from nccl_doctor.capture.names import REPORT_HTML
from nccl_doctor.cli.output import PageFile
from nccl_doctor.diagnosis import Diagnosis, Verdict
from nccl_doctor.reporters.console import ConsoleReporter
from nccl_doctor.reporters.escape import visible
from nccl_doctor.supervisor.supervisor import Supervisor
from nccl_doctor.supervisor.policy import HangPolicy
from nccl_doctor.testing import spawn


@dataclass
class Outcome:
    passed: bool
    diagnosis: Diagnosis | None
    ranks: dict[int, dict[str, Any]] = field(default_factory=dict)  # rank -> its result
    timed_out: bool = False
    exit_status: int | None = None
    capture: Path | None = None

    def reason(self) -> str:
        """The failure in one line, for pytest's short summary (``FAILED test - REASON``) and the
        JUnit ``message``: the root cause, else what failed."""
        d = self.diagnosis
        if d is not None and d.root_cause is not None:
            return one_line(f"{d.root_cause.kind.value}: {d.root_cause.title}")
        if self.timed_out:
            return "the distributed test ran past its timeout and was stopped"
        for rank, r in sorted(self.ranks.items()):
            if not r.get("passed") and r.get("error"):
                return one_line(f"rank {rank}: {r['error']}")
        silent = [r for r, x in sorted(self.ranks.items()) if x.get("missing")]
        if silent:
            return f"{ranks_text(silent)} left no result (exit status {self.exit_status})"
        return f"the distributed test failed (exit status {self.exit_status})"

    def section(self) -> str:
        """What the failure's ``nccl-doctor`` section says: where the capture is kept."""
        return f"capture: {self.capture} (nccl-doctor replay it)" if self.capture else ""

    def failure_text(self, width: int | None = None) -> str:
        """The diagnosis first (culprit rank, collective, sequence number, callsite, stacks),
        laid out for ``width`` columns (None: this process's terminal's), then each failing
        rank's traceback (testing/worker.py leaves out nccl-doctor's own frames). The capture
        is named once, by ``section``."""
        parts = []
        if self.timed_out:
            parts.append("the distributed test ran past its timeout and was stopped")
        if self.diagnosis is not None and (self.diagnosis.verdict is not Verdict.OK
                                           or self.diagnosis.findings):
            buffer = io.StringIO()
            ConsoleReporter(width).render(self.diagnosis, buffer, color=False)
            parts.append(buffer.getvalue().rstrip())
        silent = []
        for rank, r in sorted(self.ranks.items()):
            if r.get("passed"):
                continue
            if r.get("missing"):
                silent.append(rank)
            else:
                parts.append(f"--- rank {rank} ---\n"
                             + str(r.get("traceback") or r.get("error")).rstrip())
        if silent:
            parts.append(f"{ranks_text(silent)} left no result: stopped by the watchdog or the "
                         "timeout, or killed")
        return "\n\n".join(parts)


def one_line(text: str, limit: int = 500) -> str:
    """``text``'s first line, control characters written out, cut to ``limit`` characters."""
    line = visible(text.strip().split("\n", 1)[0])
    return line if len(line) <= limit else line[:limit - 3] + "..."


class PayloadError(Exception):
    """The test's fixture values cannot be sent to the ranks."""


def run_distributed(*, module: str, qualname: str, kwargs: dict[str, Any], world_size: int,
                    timeout: float, backend: str, out: Path) -> Outcome:
    out.mkdir(parents=True, exist_ok=True)
    try:
        payload = pickle.dumps({"module": module, "qualname": qualname, "kwargs": kwargs,
                                "backend": backend, "sys_path": list(sys.path)})
    except Exception as err:
        raise PayloadError(f"the test's arguments cannot be sent to its ranks ({err}); "
                           "distributed tests can only take picklable fixtures") from None
    (out / "payload.pkl").write_bytes(payload)
    # the ranks forked by this process's fork server (testing/zygote.py), where it can
    command = spawn.command(world_size, ["-m", "nccl_doctor.testing.worker",
                                         str(out / "payload.pkl")])
    # within the test's timeout: a certain deadlock is called in seconds, an idle stuck rank
    # after a third of the timeout, any wait past it
    policy = HangPolicy(hang_after=timeout, stuck_after=max(2.0, min(120.0, timeout / 3)))
    env = dict(os.environ)
    env.pop("PYTEST_XDIST_WORKER", None)
    # (a look every 50 ms, not 200: a test's end is seen sooner; a look at a test's few ranks
    # costs well under a millisecond)
    sup = Supervisor(command, out / "capture", environ=env, policy=policy,
                     on_report=PageFile(out / "capture" / REPORT_HTML), poll_interval=0.05)
    deadline = time.monotonic() + timeout
    state = {"timed_out": False}

    def enforce_timeout(s: Supervisor) -> None:
        if time.monotonic() > deadline and s.job is not None and not state["timed_out"]:
            state["timed_out"] = True
            s.job.signal(signal.SIGKILL)

    sup.attach(enforce_timeout)
    result = sup.run()
    ranks = {}
    for path in sorted(out.glob("rank*.result.json")):
        try:
            data = json.loads(path.read_text())
            ranks[int(data["rank"])] = data
        except (ValueError, KeyError, OSError):
            continue
    for rank in range(world_size):
        ranks.setdefault(rank, {"rank": rank, "passed": False, "missing": True})
    d = result.diagnosis
    passed = (result.exit_status == 0 and all(r["passed"] for r in ranks.values())
              and not state["timed_out"] and (d is None or d.verdict is Verdict.OK))
    return Outcome(passed, d, ranks, state["timed_out"], result.exit_status, out / "capture")
