"""``nccl-doctor check PATH...``: the static pre-flight (nccl_doctor/check/): the collectives a
rank-dependent condition lets some ranks skip, found in the source before the job runs."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from nccl_doctor.errors import ExitStatus, InputNotFound

HELP = ("find, before the run, the collectives a rank-dependent condition lets some ranks skip "
        "(files or folders of Python)")



def register(sub: argparse._SubParsersAction) -> None:
    from nccl_doctor.check import FORMATS

    p = sub.add_parser("check", help=HELP, description=HELP[0].upper() + HELP[1:] + ". Exit "
                       "status 0: no finding, 1: findings (docs/check.md).")
    p.add_argument("paths", type=Path, metavar="PATH", nargs="+",
                   help="a Python file, or a folder (its .py files, recursively); or, after "
                        "--, the launch command (check -- torchrun ... train.py): its script "
                        "and the modules of yours it imports")
    p.add_argument("--format", choices=FORMATS, default="console",
                   help="console: a line per finding, path:line:col: CODE message (default); "
                        "json; sarif (SARIF 2.1.0, for GitHub code scanning)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from nccl_doctor.check import check_paths, formats, settings

    targets = list(args.paths)
    first = targets[0]
    if not first.exists() and first.suffix != ".py" and "/" not in str(first):
        # a launch command (check -- torchrun ... train.py): what it runs, as the run reads it
        from nccl_doctor.check.command import files_of_command

        targets = files_of_command([str(p) for p in targets])
    missing = [p for p in targets if not p.exists()]
    if missing:
        raise InputNotFound(f"{missing[0]} does not exist: name a Python file or a folder")
    report = check_paths(targets, settings.find())
    out = {"json": formats.as_json, "sarif": formats.as_sarif}.get(args.format,
                                                                   formats.console)(report)
    sys.stdout.write(out)
    sys.stdout.flush()
    for problem in report.problems:
        sys.stderr.write(f"nccl-doctor check: {problem}\n")
    if args.format == "console":
        sys.stderr.write(formats.summary(report) + "\n")
    return ExitStatus.CHECK_FOUND if report.findings else ExitStatus.OK
