"""Where the supervisors of one multi-node job meet, read from the launch command (pure).

Zero configuration: the job's launcher already names a rendezvous every node can reach
(torchrun's ``--master-addr/--master-port`` or ``--rdzv-endpoint``, accelerate's
``--main_process_ip/--main_process_port``, deepspeed's ``--master_addr/--master_port``, else
``MASTER_ADDR``/``MASTER_PORT``), how many nodes there are and which one this is. The doctor's
coordinator listens on that host, on its own port: the job's port + ``PORT_OFFSET`` (never the
job's own store: a hung or dead rank 0 must not take the doctor with it). ``--coordinator``,
``--node-rank`` and ``--nnodes`` override what the command says.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Mapping, Sequence

#: The coordinator's port is the job's rendezvous port plus this (minus it near 65535).
PORT_OFFSET = 1000

_TORCHRUN = {"addr": ("--master-addr", "--master_addr"), "port": ("--master-port", "--master_port"),
             "endpoint": ("--rdzv-endpoint", "--rdzv_endpoint"), "nnodes": ("--nnodes",),
             "node_rank": ("--node-rank", "--node_rank")}
_ACCELERATE = {"addr": ("--main_process_ip", "--main-process-ip"),
               "port": ("--main_process_port", "--main-process-port"),
               "nnodes": ("--num_machines", "--num-machines"),
               "node_rank": ("--machine_rank", "--machine-rank")}
_DEEPSPEED = {"addr": ("--master_addr", "--master-addr"), "port": ("--master_port", "--master-port"),
              "nnodes": ("--num_nodes", "--num-nodes"), "node_rank": ("--node_rank", "--node-rank")}
_LAUNCHERS = {"torchrun": _TORCHRUN, "accelerate": _ACCELERATE, "deepspeed": _DEEPSPEED}
#: Options that take no value (so the token after them is the script, not their value).
_FLAGS = {"--standalone", "-m", "--module", "--no-python", "--no_python", "--run-path",
          "--run_path", "--virtual-local-rank", "--multi_gpu", "--multi-gpu", "--cpu",
          "--use_deepspeed", "--use_fsdp", "--use_megatron_lm", "--same_network", "--debug",
          "-q", "--quiet", "--no_ssh", "--no-ssh", "--no_local_rank", "--autotuning",
          "--force_multi", "--enable_each_rank_log", "--bind_cores_to_rank", "--save_pid",
          "--dynamo_use_fullgraph", "--dynamo_use_dynamic", "--tpu", "--no_ssh_check"}
#: torchrun reads every option from PET_<NAME> too.
_PET = {"addr": "PET_MASTER_ADDR", "port": "PET_MASTER_PORT", "endpoint": "PET_RDZV_ENDPOINT",
        "nnodes": "PET_NNODES", "node_rank": "PET_NODE_RANK"}


class RendezvousError(ValueError):
    """A value the command or an option gives cannot be used (says which and why)."""


@dataclass(frozen=True)
class Rendezvous:
    """Where this node's supervisor meets the others."""

    host: str  # the coordinator's host: node 0's
    port: int  # the coordinator's port (the doctor's own)
    nnodes: int  # nodes expected (the upper bound of an elastic range)
    node_rank: int | None  # this node's (None: not given; elastic rendezvous assigns it later)
    source: str  # where it was read: "torchrun --master-addr/--master-port", "--coordinator"...
    job: str  # the job's own rendezvous "host:port" (both sides check they serve the same job)

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"


def launcher(command: Sequence[str]) -> tuple[str, int] | None:
    """(launcher name, index of its first option) when ``command`` is a known launcher."""
    for i, token in enumerate(command[:4]):
        base = os.path.basename(token)
        if base == "torchrun":
            return "torchrun", i + 1
        if base == "accelerate" and i + 1 < len(command) and command[i + 1] == "launch":
            return "accelerate", i + 2
        if base == "deepspeed":
            return "deepspeed", i + 1
        if token == "-m" and i + 1 < len(command) and command[i + 1] in (
                "torch.distributed.run", "torch.distributed.launch"):
            return "torchrun", i + 2
    return None


def launcher_options(command: Sequence[str], start: int) -> dict[str, str]:
    """The launcher's ``--option value`` pairs, up to the script it runs."""
    out: dict[str, str] = {}
    i = start
    while i < len(command):
        token = command[i]
        if not token.startswith("-") or token == "--":
            break
        if "=" in token:
            name, _, value = token.partition("=")
            out[name] = value
        elif token in ("-m", "--module"):
            break  # the module to run follows: the launcher's options are over
        elif token in _FLAGS or i + 1 >= len(command) or command[i + 1].startswith("-"):
            out[token] = ""
        else:
            out[token] = command[i + 1]
            i += 1
        i += 1
    return out


def _pick(options: Mapping[str, str], names: Sequence[str]) -> str | None:
    return next((options[n] for n in names if options.get(n)), None)


def _int(text: str, what: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise RendezvousError(f"{what} {text!r} is not a whole number") from None


def _nnodes(text: str) -> int:
    # torchrun accepts an elastic range "MIN:MAX"
    return _int(text.rpartition(":")[2], "--nnodes")


def split_address(text: str, what: str) -> tuple[str, int]:
    host, sep, port = text.rpartition(":")
    if not sep or not host:
        raise RendezvousError(f"{what} {text!r} is not HOST:PORT")
    value = _int(port, f"{what} port")
    if not 0 < value < 65536:
        raise RendezvousError(f"{what} {text!r}: the port must be 1-65535")
    return host.strip("[]"), value


def doctor_port(job_port: int) -> int:
    """The coordinator's port for a job that meets on ``job_port``."""
    port = job_port + PORT_OFFSET
    return port if port < 65536 else job_port - PORT_OFFSET


def find(command: Sequence[str], environ: Mapping[str, str], *, coordinator: str | None = None,
         node_rank: int | None = None, nnodes: int | None = None) -> Rendezvous | None:
    """Where this node meets the others, or None for a single-node job (nothing to meet)."""
    found = launcher(command)
    name = found[0] if found else ""
    options = launcher_options(command, found[1]) if found else {}
    names = _LAUNCHERS.get(name, {})

    def get(key: str) -> str | None:
        value = _pick(options, names.get(key, ()))
        if value is None and name == "torchrun":
            value = environ.get(_PET[key]) or None
        return value

    count = nnodes if nnodes is not None else (
        _nnodes(v) if (v := get("nnodes")) else
        _int(environ["SLURM_NNODES"], "SLURM_NNODES") if environ.get("SLURM_NNODES") else None)
    rank = node_rank if node_rank is not None else (
        _int(v, "--node-rank") if (v := get("node_rank")) else None)
    if coordinator:
        host, port = split_address(coordinator, "--coordinator")
        return Rendezvous(host, port, count or 0, rank, "--coordinator", coordinator)
    if count is None or count < 2:
        return None  # one node: every rank is this supervisor's own
    endpoint, addr, port_text = get("endpoint"), get("addr"), get("port")
    if endpoint:
        host, job_port = split_address(endpoint if ":" in endpoint else f"{endpoint}:29400",
                                       "--rdzv-endpoint")
        source = f"{name} --rdzv-endpoint"
    elif addr or port_text:
        host, job_port = addr or "127.0.0.1", _int(port_text or "29500", "--master-port")
        source = f"{name} master address/port"
    elif environ.get("MASTER_ADDR"):
        host = environ["MASTER_ADDR"]
        job_port = _int(environ.get("MASTER_PORT") or "29500", "MASTER_PORT")
        source = "MASTER_ADDR/MASTER_PORT"
    else:
        return None  # several nodes, but nothing says where they meet: --coordinator
    return Rendezvous(host, doctor_port(job_port), count, rank, source, f"{host}:{job_port}")


def several_nodes(command: Sequence[str], environ: Mapping[str, str],
                  nnodes: int | None = None) -> bool:
    """Whether the command launches more than one node (however it says where they meet)."""
    if nnodes is not None:
        return nnodes > 1
    found = launcher(command)
    if found is None:
        return False
    options = launcher_options(command, found[1])
    names = _LAUNCHERS[found[0]]
    text = _pick(options, names["nnodes"])
    try:
        return text is not None and _nnodes(text) > 1
    except RendezvousError:
        return False
