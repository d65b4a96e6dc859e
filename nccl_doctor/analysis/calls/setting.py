"""Where the ranks ran, for the advice a finding gives: a job (launched by torchrun, a scheduler,
``nccl-doctor run``), or one distributed test of the pytest plugin, whose ranks each run one
test function - where a launcher's options (``--max-restarts``) mean nothing and an exception
is the test failing.

Read from the launched command the capture keeps (its manifest), so the live diagnosis and a
replay of a kept capture give the same advice."""

from __future__ import annotations

import enum
from typing import Sequence

from nccl_doctor.model import TraceSet

#: The module each rank of a distributed test runs (``nccl_doctor/testing/worker.py``): the
#: plugin's runner launches ``... -m TEST_WORKER PAYLOAD``.
TEST_WORKER = "nccl_doctor.testing.worker"


class Setting(enum.Enum):
    JOB = "job"  # a job of its own: its launcher's options are advice
    TEST = "test"  # one distributed test (the pytest plugin): the advice is about the test


def setting_of(traces: TraceSet) -> Setting:
    return setting_of_command(traces.command)


def setting_of_command(command: Sequence[str]) -> Setting:
    """``TEST`` for the command the plugin's runner launches (``-m TEST_WORKER``)."""
    words = list(command)
    return Setting.TEST if any(a == "-m" and b == TEST_WORKER
                               for a, b in zip(words, words[1:])) else Setting.JOB
