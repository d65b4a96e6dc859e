"""The Slurm allocation a run is inside, and the job steps it started: read through Slurm's own
commands (``scontrol``), each asked with a timeout; what Slurm cannot answer is an error of one
line, never an exception into the supervision."""

from __future__ import annotations

import os
import re
import subprocess
import time
from pathlib import Path
from dataclasses import dataclass
from typing import Iterable, Mapping, Sequence

from nccl_doctor import env


class SlurmError(Exception):
    """Slurm could not answer (the message is one line)."""


def _run(argv: Sequence[str], timeout: float = 20.0) -> str:
    try:
        proc = subprocess.run(list(argv), capture_output=True, text=True, timeout=timeout)
    except FileNotFoundError:
        raise SlurmError(f"{argv[0]} not found (Slurm's client commands are not on PATH)") from None
    except (OSError, subprocess.TimeoutExpired) as err:
        raise SlurmError(f"{' '.join(argv[:3])}: {err}") from None
    if proc.returncode != 0:
        said = (proc.stderr.strip().splitlines() or [f"exit {proc.returncode}"])[0]
        raise SlurmError(f"{' '.join(argv[:3])}: {said}")
    return proc.stdout


@dataclass(frozen=True)
class Allocation:
    """The allocation (salloc, sbatch) this run is inside."""

    job_id: str
    nodes: tuple[str, ...]  # its nodes, as Slurm names them (slurm.conf's NodeName)

    @classmethod
    def of(cls, environ: Mapping[str, str]) -> "Allocation | None":
        """The allocation ``environ`` is inside (None: none); ``SlurmError`` if Slurm cannot
        say which nodes it holds."""
        job = environ.get(env.SLURM_JOB_ID)
        if not job:
            return None
        nodelist = environ.get("SLURM_JOB_NODELIST") or environ.get("SLURM_NODELIST") or ""
        nodes = tuple(_run(["scontrol", "show", "hostnames", nodelist]).split()) if nodelist \
            else ()
        if not nodes:
            raise SlurmError(f"Slurm job {job}: no nodes in SLURM_JOB_NODELIST")
        return cls(job, nodes)


def is_srun(command: Sequence[str]) -> bool:
    """Whether the command is Slurm's launcher (``srun ...``, or after ``env A=B``)."""
    words = list(command)
    if words and os.path.basename(words[0]) == "env":
        words = [w for w in words[1:] if "=" not in w or w.startswith("-")]
    return bool(words) and os.path.basename(words[0]) == "srun"


@dataclass(frozen=True)
class Step:
    id: str  # JOBID.STEPID
    name: str
    srun_host: str
    srun_pid: int


_FIELD = re.compile(r"(\S+?)=(\S*)")


def steps(job_id: str) -> list[Step]:
    """The allocation's running steps, with the host and pid of the srun that launched each
    (``scontrol show step``'s SrunHost:Pid)."""
    out = []
    for line in _run(["scontrol", "show", "step", "-o"]).splitlines():
        fields = dict(_FIELD.findall(line))
        step_id = fields.get("StepId", "")
        if not step_id.startswith(f"{job_id}."):
            continue
        host, _, pid = fields.get("SrunHost:Pid", "").rpartition(":")
        out.append(Step(step_id, fields.get("Name", ""), host,
                        int(pid) if pid.isdigit() else 0))
    return out


def launched_by(job_id: str, pids: Iterable[int], hosts: Iterable[str]) -> list[Step]:
    """The allocation's steps launched by an srun among ``pids`` on one of ``hosts`` (this
    host's names: Slurm may record the short one)."""
    mine, here = set(pids), set(hosts)
    return [s for s in steps(job_id) if s.srun_pid in mine and s.srun_host in here]


def scancel(step_ids: Sequence[str]) -> None:
    """Stop these steps through Slurm (their tasks on every node)."""
    if step_ids:
        _run(["scancel", *step_ids])


#: How close to the job's end time a signal is read as its time limit: Slurm sends its own
#: SIGTERM at the limit, and ``--signal=SIG@SECONDS``'s that many seconds before (up to 65535;
#: a few minutes in practice)
NEAR_THE_LIMIT_S = 600.0


def why_signalled(job_id: str, now: float) -> str:
    """What Slurm says of a signal its job got at ``now``: "preemption", "its time limit
    (1:00:00, ending 14:40:00)", "scancel", or "" (nothing Slurm says explains it, or Slurm
    cannot answer)."""
    try:
        line = _run(["scontrol", "show", "job", "-o", job_id], timeout=5.0)
    except SlurmError:
        return ""
    fields = dict(re.findall(r"(\w+)=(\S*)", line))
    state, reason = fields.get("JobState", ""), fields.get("Reason", "")
    if "PREEMPT" in state or "Preempt" in reason:
        return "preemption"
    end, limit = fields.get("EndTime", ""), fields.get("TimeLimit", "")
    try:
        ends = time.mktime(time.strptime(end, "%Y-%m-%dT%H:%M:%S"))
    except (ValueError, OverflowError):
        ends = None
    if state == "TIMEOUT" or (ends is not None and limit not in ("", "UNLIMITED")
                              and ends - now <= NEAR_THE_LIMIT_S):
        return f"its time limit ({limit}, ending {end.split('T')[-1]})"
    if state == "CANCELLED":
        return "scancel"
    return ""


def requeue_of(out: Path, environ: Mapping[str, str]) -> bool:
    """Whether ``out`` holds the captures of an earlier launch of this very Slurm job (sbatch
    ``--requeue``, ``scontrol requeue``, preemption with requeue): the batch script runs again
    with ``SLURM_RESTART_COUNT`` one higher and the same ``--out``, and the earlier launch's
    captures are kept beside the new one's, its attempt (report.json's attempts)."""
    job = environ.get(env.SLURM_JOB_ID)
    requeues = env.attempt_of(environ)[0]
    if not job or requeues == 0:
        return False
    from nccl_doctor.capture.names import capture_files
    from nccl_doctor.capture.reader import read_counters
    from nccl_doctor.errors import DoctorError

    for path in capture_files(out):
        try:
            recorded = read_counters(path)[0].get("env")
        except (DoctorError, OSError):
            continue
        if isinstance(recorded, dict) and recorded.get(env.SLURM_JOB_ID) == job and \
                env.attempt_of(recorded)[0] < requeues:
            return True
    return False
