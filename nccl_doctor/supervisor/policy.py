"""When the watchdog calls a hang, and what it does then (``nccl-doctor run`` options)."""

from __future__ import annotations

import enum
from dataclasses import dataclass

#: ``--hang-after`` default. A wait this long is a hang whatever the stacks say. It sits above the
#: long pauses that healthy big jobs take while other ranks wait (a checkpoint of a large model, an
#: evaluation on rank 0: minutes) and well below the backends' own timeouts that users raise to
#: survive those pauses (NCCL's is 10 min by default, often set to 30-120 min).
DEFAULT_HANG_AFTER = 900.0


#: ``--stuck-after`` default (see HangPolicy.stuck_after).
DEFAULT_STUCK_AFTER = 120.0


class OnHang(str, enum.Enum):
    REPORT = "report"  # write the diagnosis, keep watching (the job goes on hanging)
    KILL = "kill"  # write the diagnosis, then stop the whole job
    # write the diagnosis, then end the hung ranks' processes only, for a launcher that restarts
    # failed workers (torchrun --max-restarts) to start them again; bounded by its restarts
    RESTART = "restart"


#: ``--on-hang`` default: a certain deadlock never recovers, and every minute it holds the GPUs is
#: paid for; the report is written before anything is stopped.
DEFAULT_ON_HANG = OnHang.KILL


@dataclass(frozen=True)
class HangPolicy:
    on_hang: OnHang = DEFAULT_ON_HANG
    hang_after: float = DEFAULT_HANG_AFTER  # seconds without progress that make any wait a hang
    quiet: float = 1.0  # seconds without any new record before the watchdog reads the captures
    look_every: float = 1.0  # seconds between full reads while nothing moves
    confirm: float = 1.0  # a deadlock must hold this long, unchanged, before it is called
    # An awaited rank idle with an unchanged stack this long is stuck. Conservative: a rank that
    # sleeps or waits on I/O for a minute is slow, not hung, and --on-hang kill would cost the
    # job. A stopped process is called at once; a deadlock never waits for this.
    stuck_after: float = DEFAULT_STUCK_AFTER
    sample_every: float = 2.0  # seconds between stack/CPU samples of awaited ranks
    idle_cpu: float = 0.05  # CPU share under which a process counts as idle
    stack_timeout: float = 5.0  # per stack dump
    # The stop: every rank is asked to exit (its agent flushes its output and leaves with status
    # 0, so torchrun ends quietly, with no traceback and no restart); the launcher gets
    # leave_grace seconds to end by itself, then SIGTERM, then SIGKILL kill_grace later
    leave_grace: float = 3.0
    kill_grace: float = 5.0  # SIGTERM, then SIGKILL after this many seconds

    def __post_init__(self) -> None:
        if self.hang_after <= 0:
            raise ValueError("hang_after must be positive")
