"""Who sent a signal to ``nccl-doctor run``, in words: the sender the C handler in front of
Python's kept (``_senders.c``: its pid, uid and the kernel's si_code), its name read from /proc
while the signal is handled (a ``kill`` is gone a moment later). Best effort: without the
compiled helper, or for a sender already gone, less is said - never an error."""

from __future__ import annotations

import signal
from pathlib import Path

try:
    from nccl_doctor.supervisor import _senders
except ImportError:  # (not built: no C compiler at install)
    _senders = None  # type: ignore[assignment]

#: si_code: sent by the kernel (a terminal's Ctrl-C or hang-up), not by a process
SI_KERNEL = 0x80
MAX_NAME = 120


def watch(sig: int) -> None:
    """Keep the sender of ``sig`` from now on (its Python handler installed already)."""
    if _senders is not None:
        try:
            _senders.watch(sig)
        except (OSError, ValueError):
            pass


def unwatch(sig: int) -> None:
    if _senders is not None:
        try:
            _senders.unwatch(sig)
        except (OSError, ValueError):
            pass


def sender(sig: int) -> str:
    """Who sent ``sig`` last ("" where it is not known): "the terminal (Ctrl-C)", "pid 4242
    (scancel --signal=TERM 77, uid 1000)", "Slurm (slurmstepd, pid 4242)". Called from the
    signal's Python handler, once: it reads /proc and clears what was kept."""
    if _senders is None:
        return ""
    try:
        found = _senders.last(sig)
    except (OSError, ValueError):
        return ""
    if found is None:
        return ""
    pid, uid, code = found
    if code == SI_KERNEL or pid <= 0:
        return {signal.SIGINT: "the terminal (Ctrl-C)",
                signal.SIGHUP: "the terminal, closed"}.get(sig, "the kernel")
    name, command = _process(pid)
    if name.startswith("slurmstepd") or name.startswith("slurmd"):
        return f"Slurm ({name}, pid {pid})"
    what = command or name or "gone"
    return f"pid {pid} ({what[:MAX_NAME]}, uid {uid})"


def _process(pid: int) -> tuple[str, str]:
    """The process's name and command line ("" for what cannot be read: it is gone)."""
    proc = Path("/proc") / str(pid)
    try:
        name = (proc / "comm").read_text().strip()
    except OSError:
        name = ""
    try:
        command = " ".join((proc / "cmdline").read_bytes().decode(errors="replace")
                           .split("\0")).strip()
    except OSError:
        command = ""
    return name, command
