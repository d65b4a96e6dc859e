"""The job dies with its supervisor: a tiny process that stops the job if ``nccl-doctor run``
is killed without a chance to do it itself (SIGKILL, the OOM killer, a scheduler's kill).

The supervisor starts it right before the job, in a session of its own (a signal to the
supervisor's process group does not take it down first), and holds the write end of a pipe to
its stdin. Over it the supervisor tells the reaper the job's process group once launched, each
rank it adopts (torchrun starts every worker in a
session of its own, so stopping the launcher's process group does not reach them) and, when it
has reaped the job itself, ``done``. End of file without ``done`` means the supervisor is gone:
the reaper sends SIGTERM to the job's process group, to every adopted rank still alive (the
same pid *and* start time: a reused pid is never signalled) and to every process whose
environment carries the run's id (``NCCL_DOCTOR_RUN_ID``: a job launched in the instant before
the supervisor was killed, its process group untold), SIGKILL to what is left after
``GRACE`` seconds, and keeps a ``supervisor_lost`` event in the capture directory's
``watchdog.json``, which ``replay`` reads ("supervisor lost at ~t").

Run as ``python -S -c "...reaper.main(...)" OUT_DIR RUN_ID`` (``Reaper`` starts it so; ``python -m
nccl_doctor.supervisor.reaper OUT_DIR RUN_ID`` does the same). Every run starts one, so its
start is kept to the interpreter's own: no ``site`` (the ``.pth`` files of the environment, an
editable install's finder), nothing imported but ``os``, ``signal``, ``sys`` and ``time`` - 16 ms
of CPU, not 35. What it needs to stop a job (psutil, the watch record) it imports then, with
``site`` loaded first.
"""

from __future__ import annotations

import atexit
import os
import signal
import sys
import time

from nccl_doctor.env import LAUNCHER_RANK, RUN_ID
from nccl_doctor.processes import started

TYPE_CHECKING = False
if TYPE_CHECKING:
    import subprocess
    from pathlib import Path
    from typing import IO

GRACE = 10.0  # seconds between SIGTERM and SIGKILL: torchrun stops its workers in that time
DONE = "done"
#: Reapers told DONE and still exiting: reaped without blocking (``_reap_exited``), and waited
#: for at this process's exit (an embedding process, a test session, runs many jobs).
_EXITING: list[subprocess.Popen] = []


def _reap_exited(block: bool = False) -> None:
    if not _EXITING:  # (the reaper process itself: subprocess stays unimported)
        return
    import subprocess

    for proc in list(_EXITING):
        try:
            done = proc.wait(timeout=5) if block else proc.poll()
        except subprocess.TimeoutExpired:
            proc.kill()
            done = proc.wait()
        if done is not None:
            _EXITING.remove(proc)


atexit.register(_reap_exited, True)


class Reaper:
    """The supervisor's end: start the reaper, tell it the ranks, release it at the end."""

    def __init__(self, out_dir: Path, run_id: str) -> None:
        """Started before the job (``job`` tells it the job's process group once launched):
        however soon the supervisor is killed, the job is never left behind."""
        import subprocess

        _reap_exited()
        self.proc: subprocess.Popen | None = None
        self._pipe: IO[str] | None = None
        try:
            self.proc = subprocess.Popen(
                [sys.executable, "-S", "-c", _MAIN, str(out_dir), run_id or "-"],
                stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True,
                start_new_session=True, close_fds=True,
                env={**os.environ, "PYTHONPATH": _own_path()})
            self._pipe = self.proc.stdin
        except OSError:  # no reaper: the job is still supervised, only not past a SIGKILL
            self.proc = None

    def job(self, pgid: int) -> None:
        self._say(f"job {pgid}")

    def adopt(self, pid: int, created: float) -> None:
        self._say(f"adopt {pid} {created!r}")

    def release(self) -> None:
        """The supervisor reaped the job itself: the reaper exits without touching it."""
        self._say(DONE)
        if self._pipe is not None:
            try:
                self._pipe.close()
            except OSError:
                pass
            self._pipe = None
        if self.proc is not None:  # it exits on reading DONE; not waited for here (a blocking
            # wait cost the end of every run 10-40 ms): reaped by the next reaper's start, or at
            # this process's exit
            _EXITING.append(self.proc)
            self.proc = None

    def _say(self, line: str) -> None:
        if self._pipe is None:
            return
        try:
            self._pipe.write(line + "\n")
            self._pipe.flush()
        except (OSError, ValueError):  # the reaper died: the job goes on, unguarded
            self._pipe = None


#: the reaper process's program (``python -S -c``: no runpy, whose imports ``-m`` costs)
_MAIN = "import sys; from nccl_doctor.supervisor import reaper; sys.exit(reaper.main(sys.argv[1:]))"


def _own_path() -> str:
    """PYTHONPATH that finds this nccl_doctor first (with ``-S``, the only way it is found)."""
    here = os.path.dirname(os.path.dirname(os.path.dirname(os.path.realpath(__file__))))
    rest = os.environ.get("PYTHONPATH", "")
    return os.pathsep.join([here] + ([rest] if rest else []))


# -- the reaper process ---------------------------------------------------------------------


def _alive(pgid: int | None, ranks: dict[int, float]) -> list[int]:
    """Adopted ranks still alive (same start time), plus 0 for a live process group."""
    out = [pid for pid, created in ranks.items() if started(pid) == created]
    if pgid:
        try:
            os.killpg(pgid, 0)
            out.append(0)
        except OSError:
            pass
    return out


def _signal(pgid: int | None, ranks: dict[int, float], sig: int) -> None:
    if pgid:
        try:
            os.killpg(pgid, sig)
        except OSError:
            pass
    for pid in _alive(pgid, ranks):
        if pid:
            try:
                os.kill(pid, sig)
            except OSError:
                pass


def of_run(run_id: str) -> dict[int, float]:
    """pid -> start time of every process (this user may read) whose environment carries
    ``run_id``: the job's processes, told or not."""
    needle = f"{RUN_ID}={run_id}".encode()
    out: dict[int, float] = {}
    try:
        entries = os.listdir("/proc")
    except OSError:
        return out
    for entry in entries:
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            with open(f"/proc/{entry}/environ", "rb") as f:
                found = needle in f.read().split(b"\0")
        except OSError:
            continue
        created = started(int(entry)) if found else None
        if created is not None:
            out[int(entry)] = created
    return out


def ranks_of_run(run_id: str) -> dict[int, int]:
    """rank -> pid of the job's process that is that rank on this host, read from each run
    process's environment (the launcher's RANK, or MPI's, Slurm's): the outermost one, where a
    rank's children (DataLoader workers) carry its variables too. Ranks whose process is gone,
    or not readable, are absent."""
    found: dict[int, list[tuple[int, int]]] = {}  # rank -> [(pid, parent pid)]
    for pid in of_run(run_id):
        try:
            with open(f"/proc/{pid}/environ", "rb") as f:
                environ = dict(item.split(b"=", 1) for item in f.read().split(b"\0")
                               if b"=" in item)
            with open(f"/proc/{pid}/stat", "rb") as f:
                stat = f.read()
            parent = int(stat[stat.rindex(b")") + 2:].split()[1])
        except (OSError, ValueError, IndexError):
            continue
        rank = next((environ[name.encode()] for name in LAUNCHER_RANK
                     if name.encode() in environ), None)
        if rank is not None and rank.isdigit():
            found.setdefault(int(rank), []).append((pid, parent))
    out = {}
    for rank, procs in found.items():
        pids = {pid for pid, _ in procs}
        outer = [pid for pid, parent in procs if parent not in pids]
        if len(outer) == 1:
            out[rank] = outer[0]
    return out


def stop_job(pgid: int | None, ranks: dict[int, float], grace: float = GRACE) -> list[str]:
    """SIGTERM, then SIGKILL after ``grace`` seconds for what is left; the signals sent."""
    if not _alive(pgid, ranks):
        return []
    _signal(pgid, ranks, signal.SIGTERM)
    sent = ["SIGTERM"]
    deadline = time.monotonic() + grace
    while _alive(pgid, ranks) and time.monotonic() < deadline:
        time.sleep(0.1)
    if _alive(pgid, ranks):
        _signal(pgid, ranks, signal.SIGKILL)
        sent.append("SIGKILL")
    return sent


def main(argv: list[str]) -> int:
    out_dir, run_id = argv[0], argv[1]
    for sig in (signal.SIGINT, signal.SIGHUP, signal.SIGPIPE):
        signal.signal(sig, signal.SIG_IGN)  # only the pipe says when to act
    ranks: dict[int, float] = {}
    pgid: int | None = None
    for line in sys.stdin:
        words = line.split()
        if words == [DONE]:
            return 0
        if len(words) == 2 and words[0] == "job" and words[1].isdigit():
            pgid = int(words[1])
        if len(words) == 3 and words[0] == "adopt":
            try:
                ranks[int(words[1])] = float(words[2])
            except ValueError:
                pass
    lost_at = time.time()  # end of file without "done": the supervisor is gone
    if sys.flags.no_site:  # (started as Reaper starts it) psutil is in the environment's paths
        import site

        site.main()
    if run_id != "-":
        ranks.update(of_run(run_id))
    sent = stop_job(pgid, ranks)
    try:
        from pathlib import Path

        from nccl_doctor.capture import watch_record
        from nccl_doctor.watch_log import SupervisorLost

        watch_record.append_event(Path(out_dir), SupervisorLost(tuple(sent), round(lost_at, 3)))
    except Exception:  # the directory is gone or unwritable: the job was stopped all the same
        pass
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
