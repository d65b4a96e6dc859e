"""Names shared by the supervisor and the in-rank recorder (the handshake).

Declared once here; nothing else spells these strings.
"""

from __future__ import annotations

import os

TYPE_CHECKING = False  # (typing unimported: the reaper imports this module, at every run)
if TYPE_CHECKING:
    from collections.abc import Mapping

#: Capture directory. Its presence turns the recorder on in every Python process of the job.
CAPTURE_DIR = "NCCL_DOCTOR_DIR"
#: Set to "0" to keep the bootstrap from recording even though NCCL_DOCTOR_DIR is set.
ENABLE = "NCCL_DOCTOR_ENABLE"
#: "0": the functional collectives (DTensor, tensor parallel, compiled graphs) are not recorded;
#: their calls then show as unrecorded sequence numbers (rank/recorder/functional.py).
FUNCTIONAL = "NCCL_DOCTOR_FUNCTIONAL"
#: Number of event records in each rank's ring buffer (bounds the capture file's size).
RING_RECORDS = "NCCL_DOCTOR_RING_RECORDS"
#: Bytes reserved for each rank's interned string table.
STRTAB_BYTES = "NCCL_DOCTOR_STRTAB_BYTES"
#: Directory that holds nccl_doctor's sitecustomize bootstrap (prepended to PYTHONPATH).
BOOTSTRAP_PATH = "NCCL_DOCTOR_BOOTSTRAP"
#: Directory from which the job's interpreters can import nccl_doctor if it is not installed there.
PACKAGE_PARENT = "NCCL_DOCTOR_PACKAGE_PARENT"
#: Identifier of one `nccl-doctor run`, written into every capture so stray files are recognised.
RUN_ID = "NCCL_DOCTOR_RUN_ID"

# Variables set by launchers (torchrun, accelerate, deepspeed, SLURM) that the recorder reads.
LAUNCHER_RANK = ("RANK", "PMI_RANK", "OMPI_COMM_WORLD_RANK", "SLURM_PROCID")
LAUNCHER_LOCAL_RANK = ("LOCAL_RANK", "MPI_LOCALRANKID", "OMPI_COMM_WORLD_LOCAL_RANK", "SLURM_LOCALID")
LAUNCHER_WORLD_SIZE = ("WORLD_SIZE", "PMI_SIZE", "OMPI_COMM_WORLD_SIZE", "SLURM_NTASKS")
NODE_RANK = ("NODE_RANK", "GROUP_RANK", "SLURM_NODEID")
#: Environment variables copied into each capture's metadata (for diagnosis and known-issue rules).
RECORDED_ENV = (
    "MASTER_ADDR", "MASTER_PORT", "NODE_RANK", "GROUP_RANK", "LOCAL_WORLD_SIZE",
    "TORCHELASTIC_RESTART_COUNT", "TORCHELASTIC_RUN_ID", "CUDA_VISIBLE_DEVICES",
    "TORCH_DISTRIBUTED_DEBUG", "NCCL_DEBUG", "ACCELERATE_MIXED_PRECISION", "SLURM_JOB_ID",
    "SLURM_RESTART_COUNT",  # (with TORCHELASTIC_RESTART_COUNT: which attempt, model.RankMeta)
    "NCCL_DOCTOR_USER_CODE", "NCCL_DOCTOR_LIBRARY_CODE",  # paths.py: which code is the user's
)

#: Which launch of the job a process belongs to: (the scheduler's requeues, the elastic
#: launcher's restarts), as Slurm and torchrun/TorchElastic count them
ATTEMPT_ENV = ("SLURM_RESTART_COUNT", "TORCHELASTIC_RESTART_COUNT")


def attempt_of(environ: Mapping[str, str]) -> tuple[int, int]:
    """The attempt ``environ`` (a process's environment, or the part a capture recorded)
    names; (0, 0) where it names none. Later attempts sort after."""
    out = []
    for name in ATTEMPT_ENV:
        try:
            out.append(max(0, int(environ.get(name) or 0)))
        except ValueError:
            out.append(0)
    return out[0], out[1]


def own_launch() -> tuple[int, int]:
    """The launch this process's environment names as its scheduler's (a Slurm requeue's
    count; its elastic restarts are its ranks' to say): an earlier launch's ranks left in the
    same directory are never this one's."""
    return attempt_of(os.environ)[0], 0


#: This host's name as nccl-doctor reports it, instead of the system's (tests that simulate
#: several hosts on one machine where UTS namespaces are refused; hosts whose names collide).
HOSTNAME = "NCCL_DOCTOR_HOSTNAME"


#: Slurm's name for the node a task runs on (slurm.conf's NodeName), set in every task and batch
#: script; it can differ from the system's host name (a node named by its interconnect address).
SLURM_NODENAME = "SLURMD_NODENAME"


def host_name() -> str:
    """The host name ranks and supervisors report (``NCCL_DOCTOR_HOSTNAME``, else Slurm's name
    for the node in a Slurm task, else the system's)."""
    import os
    import socket

    return os.environ.get(HOSTNAME) or os.environ.get(SLURM_NODENAME) or socket.gethostname()

#: ``--coordinator``'s twin: HOST:PORT where the supervisors of a multi-node job meet.
COORDINATOR = "NCCL_DOCTOR_COORDINATOR"

#: Set to "1" by ``nccl-doctor run --no-redact``: the job's command line is stored verbatim, in
#: the manifest and in each rank's capture (by default its secrets are ``***``:
#: nccl_doctor/redact.py).
NO_REDACT = "NCCL_DOCTOR_NO_REDACT"

# -- the node doctors' federation (docs/nodes.md, "Authentication") ---------------------------
#: The per-job secret that authenticates every value the node doctors exchange on the
#: coordinator's store (HMAC-SHA256). ``--ray`` and Slurm runs make one and hand it to their node
#: doctors themselves; nodes started independently (torchrun per node) take it from here...
FEDERATION_KEY = "NCCL_DOCTOR_FEDERATION_KEY"
#: ... or from this file (its content, stripped; refused when others may read or replace it).
#: Without either, nodes that meet use the user's default key, ~/.nccl-doctor/federation.key
#: (made there on first use: nodes sharing a home directory agree; federation/keys.py).
FEDERATION_KEY_FILE = "NCCL_DOCTOR_FEDERATION_KEY_FILE"
#: What the job's ranks never inherit (they have no use for it).
NOT_FOR_RANKS = (FEDERATION_KEY, FEDERATION_KEY_FILE)

# -- Ray clusters (``nccl-doctor run --ray``: docs/ray.md) ------------------------------------
#: Ray's own variable: a function Ray calls at the driver's ``ray.init`` to amend the job's
#: runtime_env (nccl_doctor/rank/ray_env.py adds the doctor's settings and worker setup hook).
RAY_RUNTIME_ENV_HOOK = "RAY_RUNTIME_ENV_HOOK"
#: The user's own RAY_RUNTIME_ENV_HOOK, kept while the doctor's is set (it is called first).
RAY_USER_HOOK = "NCCL_DOCTOR_RAY_USER_HOOK"
#: The host of the supervisor that launched the job when its node doctors were started by the
#: cluster (``--ray``, Slurm): ranks there write into NCCL_DOCTOR_DIR, those of every other host
#: into that host's node directory (``capture.names.node_dir``), read by the node doctor there.
LEADER_HOST = "NCCL_DOCTOR_LEADER_HOST"
#: What the runtime_env hook never passes on to the workers (it names this host, not theirs; the
#: federation's key is the node doctors' alone).
RAY_NOT_PASSED = (HOSTNAME, RAY_USER_HOOK, *NOT_FOR_RANKS)
#: What a node doctor's supervisor checks the coordinator serves (set by ``--ray``'s keeper; no
#: launcher names the job's rendezvous there).
COORDINATOR_JOB = "NCCL_DOCTOR_COORDINATOR_JOB"

# -- Slurm (docs/slurm.md) ----------------------------------------------------------------
#: Set in an allocation (salloc, sbatch): the job whose steps the doctor starts and stops.
SLURM_JOB_ID = "SLURM_JOB_ID"
