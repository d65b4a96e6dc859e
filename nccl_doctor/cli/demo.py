"""``nccl-doctor demo [NAME] [--fixed] [--list] [--device auto|cpu|cuda]``: run a reproducer of an
upstream bug under the doctor and show the diagnosis.

On a machine whose torch sees GPUs the reproducer runs on them with NCCL (``--device auto``, the
default), one GPU per rank; with fewer GPUs than ranks, the ranks share them through NCCL's socket
path (nccl_doctor/trainers/placement.py), and the demo says so. Elsewhere it runs on the CPU with
gloo."""

from __future__ import annotations

import argparse
import sys

from nccl_doctor.cli import run as run_cli
from nccl_doctor.errors import UsageError
from nccl_doctor.reproducers import DEFAULT, REPRODUCERS, Reproducer
from nccl_doctor.supervisor.policy import DEFAULT_STUCK_AFTER
from nccl_doctor.trainers import placement

HELP = "run a reproducer of a real upstream bug under the doctor (see --list)"


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("demo", help=HELP, description=HELP[0].upper() + HELP[1:] + ".")
    p.add_argument("name", nargs="?", default=DEFAULT, metavar="NAME",
                   help=f"which reproducer (default: {DEFAULT})")
    p.add_argument("--fixed", action="store_true", help="run its fixed variant")
    p.add_argument("--list", action="store_true", help="list the reproducers and exit")
    p.add_argument("--variant", default=None, metavar="NAME",
                   help="another variant of the reproducer (see --list): e.g. packing, the "
                        "control of sft_packing_false, or abort, gloo's own abort in "
                        "cpo_logits_gather")
    p.add_argument("--device", choices=("auto", *placement.DEVICES), default="auto",
                   help="where the reproducer runs: cuda (NCCL, one GPU per rank, or ranks "
                        "sharing GPUs through NCCL's socket path), cpu (gloo), or auto (the "
                        "default): cuda when torch sees a GPU")
    run_cli.add_options(p)  # (after its own: the synopsis shows those first)
    p.set_defaults(func=demo)


def command_for(r: Reproducer, fixed: bool, more: list[str] | None = None) -> list[str]:
    """The launch command of reproducer ``r`` (torchrun; two agents for simulated nodes)."""
    extra = (["--fixed"] if fixed else []) + list(more or [])
    if r.nnodes > 1:
        return [sys.executable, "-m", "nccl_doctor.reproducers.nodes", f"--nnodes={r.nnodes}",
                f"--nproc-per-node={r.nproc}", "-m", r.module, *extra]
    return [sys.executable, "-m", "torch.distributed.run", "--standalone",
            f"--nproc-per-node={r.nproc}", "-m", r.module, *extra]


def where(r: Reproducer, device: str) -> tuple[str, str]:
    """(the device the reproducer runs on, a phrase saying how) for ``--device``."""
    gpus, why = placement.visible_gpus() if device != "cpu" else (0, "")
    if device == "cuda" and not gpus:
        raise UsageError(f"--device cuda: {why}; run the demo with --device cpu")
    if not gpus:
        return "cpu", "on the CPU with gloo" + (f" ({why})" if why else "")
    ranks = r.nproc * r.nnodes  # all on this machine: each rank places itself the same way
    if not placement.place("cuda", None, {"WORLD_SIZE": str(ranks)}, gpus).shared:
        return "cuda", f"on {ranks} GPUs with NCCL, one per rank"
    return "cuda", (f"on {gpus} GPU{'s' if gpus > 1 else ''} with NCCL: its {ranks} ranks share "
                    f"{'them' if gpus > 1 else 'it'}, each with its own NCCL_HOSTID, so NCCL "
                    "joins them through loopback sockets (its inter-node path)")


def demo(args: argparse.Namespace) -> int:
    if args.list:
        for r in REPRODUCERS.values():
            ranks = f"{r.nnodes} x {r.nproc}" if r.nnodes > 1 else f"{r.nproc}"
            default = "  (default)" if r.name == DEFAULT else ""
            variants = f"  [--variant {'|'.join(r.variants)}]" if r.variants else ""
            print(f"{r.name:20} bug {r.bug}  {ranks:>5} ranks  {r.summary}{default}{variants}")
        return 0
    r = REPRODUCERS.get(args.name)
    if r is None:
        raise UsageError(f"no reproducer named {args.name!r}: one of "
                         f"{', '.join(REPRODUCERS)} (nccl-doctor demo --list)")
    more: list[str] = []
    if args.variant is not None:
        if args.variant not in r.variants:
            known = ", ".join(r.variants) or "none"
            raise UsageError(f"{r.name} has no variant {args.variant!r} (its variants: {known})")
        more = [f"--{args.variant}"]
    device, how = where(r, args.device)
    if device == "cuda":
        more.append("--device=cuda")
    if r.stuck_after is not None and args.stuck_after == DEFAULT_STUCK_AFTER:
        args.stuck_after = r.stuck_after  # its stuck rank sleeps: no need to wait two minutes
    sys.stderr.write(f"nccl-doctor demo: {r.name} (docs/bugs.md {r.bug}: {r.summary})"
                     f"{', fixed variant' if args.fixed else ''}, {how}\n")
    return run_cli.supervise(args, command_for(r, args.fixed, more))
