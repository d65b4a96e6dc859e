"""``nccl-doctor replay DIR``: diagnose a capture directory offline, no job running."""

from __future__ import annotations

import argparse
from pathlib import Path

from nccl_doctor.analysis import analyze
from nccl_doctor.capture.directory import load_capture_dir
from nccl_doctor.cli.output import emit
from nccl_doctor.reporters import REPORTERS

HELP = "diagnose a capture directory offline (the --out DIR of `nccl-doctor run`)"


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("replay", help=HELP, description=HELP[0].upper() + HELP[1:] + ".")
    p.add_argument("capture", type=Path, metavar="DIR",
                   help="capture directory, or a single .ndcap capture file")
    p.add_argument("--format", choices=sorted(REPORTERS), default=None,
                   help="report format (default: console, or json for an -o FILE ending in .json)")
    p.add_argument("-o", "--output", type=Path, default=None, metavar="FILE",
                   help="write the report to FILE instead of stdout")
    p.add_argument("--force", action="store_true", help="overwrite FILE if it exists")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    diagnosis = analyze(load_capture_dir(args.capture))
    emit(diagnosis, args.output, args.format, args.force)
    return 0
