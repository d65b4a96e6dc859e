"""Python stacks of running rank processes, taken from outside with ``py-spy dump``.

``--nonblocking`` always: py-spy then reads the target's memory without pausing it, so a sample
never perturbs the job, and it still works on a SIGSTOPped process (blocking mode fails there with
"Failed to suspend process"). The price is an occasional torn stack on a busy rank; a hang is
exactly when ranks are not busy. Failures come back as one-line reasons, never as exceptions.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import psutil

from nccl_doctor.stacks.rank_stack import RankStack, parse_stack_json
from nccl_doctor import bounded_json

__all__ = ["PYSPY_ENV", "find_pyspy", "dump", "collect"]

#: Path of the py-spy executable to use; "none" or "" turns py-spy off.
PYSPY_ENV = "NCCL_DOCTOR_PYSPY"

_MAX_REASON = 300  # characters; a reason is one line in a report, not a log


def find_pyspy() -> str | None:
    """The py-spy executable: ``$NCCL_DOCTOR_PYSPY``, else next to this Python, else on PATH.

    An explicit ``$NCCL_DOCTOR_PYSPY`` is returned as given (a wrong path is reported by ``dump``
    rather than silently replaced by another py-spy); "none" or "" means "do not use py-spy".
    """
    chosen = os.environ.get(PYSPY_ENV)
    if chosen is not None:
        chosen = chosen.strip()
        if chosen.lower() in ("", "none"):
            return None
        if os.sep not in chosen:
            return shutil.which(chosen) or chosen
        return chosen
    beside = Path(sys.executable).parent / "py-spy"  # the venv's bin, not the resolved interpreter
    if beside.is_file() and os.access(beside, os.X_OK):
        return str(beside)
    return shutil.which("py-spy")


def unavailable_reason() -> str:
    """Why ``find_pyspy()`` found nothing, in one line."""
    if os.environ.get(PYSPY_ENV) is not None:
        return f"py-spy is unavailable (disabled by {PYSPY_ENV}={os.environ[PYSPY_ENV]!r})"
    return (
        "py-spy is unavailable (not installed beside this Python nor on PATH; "
        f"pip install py-spy or set {PYSPY_ENV})"
    )


def dump(
    pid: int, *, timeout: float = 5.0, pyspy: str | None = None
) -> tuple[list[dict[str, Any]] | None, str | None]:
    """``py-spy dump --json --nonblocking`` of ``pid``: (threads, None) or (None, reason)."""
    if isinstance(pid, bool) or not isinstance(pid, int) or pid <= 0:
        return None, f"invalid pid {pid!r}"
    exe = pyspy or find_pyspy()
    if exe is None:
        return None, unavailable_reason()
    argv = [exe, "dump", "--json", "--nonblocking", "--pid", str(pid)]
    env = dict(os.environ, RUST_BACKTRACE="0")  # the child's copy: no Rust backtrace on stderr
    try:
        proc = subprocess.Popen(
            argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env
        )
    except OSError as err:
        return None, f"cannot run py-spy at {exe}: {err.strerror or err}"
    try:
        out, err_bytes = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.communicate()  # reap it: no zombie, no orphan
        return None, f"py-spy timed out after {timeout:g}s on pid {pid}"
    except BaseException:  # KeyboardInterrupt while waiting: do not leave py-spy behind
        proc.kill()
        proc.wait()
        raise
    if proc.returncode != 0:
        return None, _failure_reason(err_bytes.decode("utf-8", "replace"), proc.returncode, pid)
    try:
        threads = bounded_json.loads(out)
    except ValueError:
        return None, f"py-spy printed unreadable output for pid {pid}: {_clip(repr(out[:80]))}"
    if not isinstance(threads, list):
        return None, f"py-spy printed a JSON {type(threads).__name__} for pid {pid}, not a list"
    return threads, None


def collect(
    pids: dict[int, int],
    *,
    timeout: float = 5.0,
    pyspy: str | None = None,
    max_workers: int = 16,
) -> dict[int, RankStack]:
    """One ``RankStack`` per rank of ``pids`` (rank -> pid), dumped in parallel, keyed by rank.

    A rank that could not be sampled has ``error`` set and no threads.
    """
    exe = pyspy or find_pyspy()
    if exe is None:
        reason = unavailable_reason()
        return {
            rank: RankStack(rank, pid, "py-spy", (), reason, time.time())
            for rank, pid in sorted(pids.items())
        }
    if not pids:
        return {}

    def one(rank: int, pid: int) -> RankStack:
        taken_at = time.time()
        threads, error = dump(pid, timeout=timeout, pyspy=exe)
        if threads is None:
            return RankStack(rank, pid, "py-spy", (), error, taken_at)
        try:
            return parse_stack_json(threads, rank=rank, pid=pid, source="py-spy", taken_at=taken_at)
        except ValueError as err:
            return RankStack(rank, pid, "py-spy", (), f"py-spy output: {err}", taken_at)

    workers = max(1, min(max_workers, len(pids)))
    with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="nccl-doctor-pyspy") as pool:
        futures = {rank: pool.submit(one, rank, pid) for rank, pid in sorted(pids.items())}
        return {rank: future.result() for rank, future in futures.items()}


_CAUSE = re.compile(r"^\d+:\s*(.*)$")
_DENIED = ("permission denied", "operation not permitted")


def _failure_reason(stderr: str, returncode: int, pid: int) -> str:
    gone = _gone(pid)
    if gone:
        return gone
    lines = []
    for raw in stderr.splitlines():
        line = raw.strip()
        if line.startswith("Stack backtrace:"):
            break
        if line:
            lines.append(line)
    if any(marker in line.lower() for line in lines for marker in _DENIED):
        return (
            f"permission denied reading pid {pid}: py-spy needs ptrace rights (run as the job's "
            "user or root, add CAP_SYS_PTRACE in a container, check kernel.yama.ptrace_scope)"
        )
    if not lines:
        return f"py-spy exited with status {returncode} on pid {pid}"
    head = next((ln for ln in lines if ln.startswith("Error:")), lines[0])
    message = head.removeprefix("Error:").strip()
    causes = [m.group(1) for ln in lines if (m := _CAUSE.match(ln))]
    if causes and causes[-1] not in message:
        message = f"{message} ({causes[-1]})"
    return _clip(f"py-spy on pid {pid}: {message}")


def _gone(pid: int) -> str | None:
    try:
        status = psutil.Process(pid).status()
    except psutil.NoSuchProcess:
        return f"process {pid} is gone"
    except psutil.Error:
        return None
    if status == psutil.STATUS_ZOMBIE:
        return f"process {pid} has exited (zombie, not yet reaped)"
    return None


def _clip(text: str) -> str:
    text = " ".join(text.split())
    return text if len(text) <= _MAX_REASON else text[: _MAX_REASON - 3] + "..."
