"""``nccl-doctor demo [NAME] [--fixed] [--list]``: run a reproducer of an upstream bug under the
doctor and show the diagnosis."""

from __future__ import annotations

import argparse
import sys

from nccl_doctor.cli import run as run_cli
from nccl_doctor.errors import UsageError
from nccl_doctor.reproducers import DEFAULT, REPRODUCERS, Reproducer

HELP = "run a reproducer of a real upstream bug under the doctor (see --list)"


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("demo", help=HELP, description=HELP[0].upper() + HELP[1:] + ".")
    p.add_argument("name", nargs="?", default=DEFAULT, metavar="NAME",
                   help=f"which reproducer (default: {DEFAULT})")
    p.add_argument("--fixed", action="store_true", help="run its fixed variant")
    p.add_argument("--list", action="store_true", help="list the reproducers and exit")
    run_cli.add_options(p)
    p.set_defaults(func=demo)


def command_for(r: Reproducer, fixed: bool) -> list[str]:
    """The launch command of reproducer ``r`` (torchrun; two agents for simulated nodes)."""
    extra = ["--fixed"] if fixed else []
    if r.nnodes > 1:
        return [sys.executable, "-m", "nccl_doctor.reproducers.nodes", f"--nnodes={r.nnodes}",
                f"--nproc-per-node={r.nproc}", "-m", r.module, *extra]
    return [sys.executable, "-m", "torch.distributed.run", "--standalone",
            f"--nproc-per-node={r.nproc}", "-m", r.module, *extra]


def demo(args: argparse.Namespace) -> int:
    if args.list:
        for r in REPRODUCERS.values():
            ranks = f"{r.nnodes} x {r.nproc}" if r.nnodes > 1 else f"{r.nproc}"
            default = "  (default)" if r.name == DEFAULT else ""
            print(f"{r.name:20} bug {r.bug}  {ranks:>5} ranks  {r.summary}{default}")
        return 0
    r = REPRODUCERS.get(args.name)
    if r is None:
        raise UsageError(f"no reproducer named {args.name!r}: one of "
                         f"{', '.join(REPRODUCERS)} (nccl-doctor demo --list)")
    sys.stderr.write(f"nccl-doctor demo: {r.name} (BUGS.md {r.bug}: {r.summary})"
                     f"{', fixed variant' if args.fixed else ''}\n")
    return run_cli.supervise(args, command_for(r, args.fixed))
