"""What the supervisor asks of the node doctors a cluster runs for it (``--ray``: Ray's actors;
Slurm: an overlapping step): a listener called every tick, told when the job starts, is stopped
and ends."""

from __future__ import annotations

from typing import Any, Protocol


class Cluster(Protocol):
    def prepare(self, supervisor: Any) -> None:
        """Before the job starts (its node doctors up, where they must be first)."""

    def start(self, supervisor: Any) -> None:
        """The job started."""

    def __call__(self, supervisor: Any) -> None:
        """Each tick: what the node doctors said since."""

    def stopping(self, sig: int) -> None:
        """The supervisor stops the job with ``sig`` (a hang under ``--on-hang kill``)."""

    def end(self) -> None:
        """The job ended: every node doctor ends its node's part, then reports."""

    def close(self, wait: float) -> None:
        """The report is written: wait (up to ``wait`` s) for the node doctors to go."""
