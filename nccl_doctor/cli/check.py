"""``nccl-doctor check PATH...``: the static pre-flight (nccl_doctor/check/): the collectives a
rank-dependent condition lets some ranks skip, found in the source before the job runs."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from nccl_doctor.errors import ExitStatus, InputNotFound, UsageError

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
    how = p.add_mutually_exclusive_group()
    how.add_argument("--diff", action="store_true",
                     help="print the mechanical fixes as a unified diff (the files are left "
                          "as they are); the findings with no such fix are said on stderr, "
                          "with why")
    how.add_argument("--fix", action="store_true",
                     help="make the mechanical fixes in the files, then check them again and "
                          "say what is left")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from nccl_doctor.check import check_paths, formats, settings

    targets = list(args.paths)
    first = targets[0]
    configs: list[Path] = []
    if not first.exists() and first.suffix != ".py" and "/" not in str(first):
        # a launch command (check -- torchrun ... train.py): what it runs, as the run reads it
        from nccl_doctor.check.command import configs_of_command, files_of_command

        argv = [str(p) for p in targets]
        targets, configs = files_of_command(argv), configs_of_command(argv)
    missing = [p for p in targets if not p.exists()]
    if missing:
        raise InputNotFound(f"{missing[0]} does not exist: name a Python file or a folder")
    found = settings.find()
    report = check_paths(targets, found, configs)
    if args.diff or args.fix:
        if args.format != "console":
            raise UsageError(f"--{'diff' if args.diff else 'fix'} says its patch and what is "
                             "left on the console: drop --format")
        return _fixes(report, targets, found, configs, write=args.fix)
    if args.format == "console":
        from nccl_doctor.reporters.layout import width_of

        out = formats.console(report, width_of(sys.stdout))
    else:
        out = {"json": formats.as_json, "sarif": formats.as_sarif}[args.format](report)
    sys.stdout.write(out)
    sys.stdout.flush()
    for problem in report.problems:
        sys.stderr.write(f"nccl-doctor check: {problem}\n")
    if args.format == "console":
        sys.stderr.write(formats.summary(report) + "\n")
    return ExitStatus.CHECK_FOUND if report.findings else ExitStatus.OK


def _fixes(report, targets, found, configs, *, write: bool) -> int:
    """--diff: the patch on stdout. --fix: the files rewritten (each whole, atomically), then
    checked again. Either way the findings not fixed go to stderr, each with why."""
    from nccl_doctor import paths
    from nccl_doctor.check import check_paths, formats
    from nccl_doctor.check.fixes import fix_files

    fixed = fix_files(report.findings)
    made = sum(o.made for ff in fixed for o in ff.outcomes)
    for ff in fixed:
        if ff.after != ff.before:
            if write:
                ff.write()
            else:
                sys.stdout.write(ff.diff(paths.short_path(ff.path)))
    sys.stdout.flush()
    for ff in fixed:
        for o in ff.outcomes:
            if not o.made:
                f = o.finding
                sys.stderr.write(f"{paths.short_path(f.path)}:{f.line}:{f.col}: {f.code} "
                                 f"{o.done}\n")
    n = len(report.findings)
    files = sum(ff.after != ff.before for ff in fixed)
    if not write:
        sys.stderr.write(f"nccl-doctor check --diff: {made} of {n} finding"
                         f"{'s' if n != 1 else ''} with a fix, in {files} file"
                         f"{'s' if files != 1 else ''} (--fix makes it)\n")
        return ExitStatus.CHECK_FOUND if n else ExitStatus.OK
    left = check_paths(targets, found, configs)
    from nccl_doctor.reporters.layout import width_of

    sys.stdout.write(formats.console(left, width_of(sys.stdout)))
    sys.stderr.write(f"nccl-doctor check --fix: fixed {made} of {n} finding"
                     f"{'s' if n != 1 else ''} in {files} file{'s' if files != 1 else ''}; "
                     + formats.summary(left).partition(": ")[2] + " left\n")
    return ExitStatus.CHECK_FOUND if left.findings else ExitStatus.OK
