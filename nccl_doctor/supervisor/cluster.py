"""What the supervisor asks of the node doctors a cluster runs for it (``--ray``: Ray's actors;
Slurm: an overlapping step): a listener called every tick, told when the job starts, is stopped
and ends."""

from __future__ import annotations

import json
import queue
import subprocess
import threading
from typing import Any, Iterator, Protocol


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


class Said:
    """What a node doctors' keeper says on its stdout (one JSON object a line: Ray's
    ``fleet_main``, Slurm's step of ``node_main`` tasks), read in a thread, taken each tick."""

    def __init__(self) -> None:
        self._queue: queue.Queue[dict[str, Any]] = queue.Queue()

    def put(self, record: dict[str, Any]) -> None:
        self._queue.put(record)

    def follow(self, proc: subprocess.Popen, name: str) -> None:
        """Read ``proc``'s stdout until it ends."""
        threading.Thread(target=self._read, args=(proc,), name=name, daemon=True).start()

    def _read(self, proc: subprocess.Popen) -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            try:
                said = json.loads(line)
            except ValueError:
                continue
            if isinstance(said, dict):
                self._queue.put(said)

    def taken(self) -> Iterator[dict[str, Any]]:
        """What was said since the last tick, in order."""
        while True:
            try:
                yield self._queue.get_nowait()
            except queue.Empty:
                return


def tell(said: dict[str, Any], supervisor: Any, engine: str) -> None:
    """What every keeper says alike, applied: a node doctor gone (its report written, or it
    failed), an error (announced), a node doctor running (the leader waits for it while it
    runs, however slow its start)."""
    live, fed = supervisor.live, supervisor.federation
    leader = fed.leader if fed is not None else None
    if "gone" in said and leader is not None:
        leader.gone(str(said["gone"]))
    if "error" in said:
        live.announce(f"{engine}: {said['error']}")
    elif "node" in said:
        if leader is not None:
            leader.coming(str(said["node"]))
        live.announce(f"{engine}: a node doctor runs on {said['node']} (node "
                      f"{said['node_rank']})")


def hang_up(proc: subprocess.Popen | None) -> None:
    """Close a keeper's standard input: its signal to end the node doctors' jobs."""
    if proc is not None and proc.stdin is not None:
        try:
            proc.stdin.close()
        except OSError:
            pass


def early_end(host: str, status: int) -> str:
    """What a keeper says of a node doctor that ended before the job (refused: its directory
    held, ...)."""
    return (f"the node doctor on {host} ended early (exit {status}: see docs/exit-status.md); "
            "that node's ranks go unseen")
