"""``nccl-doctor replay DIR``: diagnose a capture directory offline, no job running."""

from __future__ import annotations

import argparse
import sys
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator, TextIO

from dataclasses import replace

from nccl_doctor import paths
from nccl_doctor.cli.run import code_pattern
from nccl_doctor.errors import CaptureNotFound, ExitStatus
from nccl_doctor.reporters import FORMATS

#: Captures from which replay shows a progress bar while it reads them (on a terminal only).
BAR_FROM = 16


@contextmanager
def reading_bar(stream: TextIO) -> Iterator[None]:
    """A transient rich progress bar on ``stream`` while many captures are read; nothing off a
    terminal (a CI log, a pipe) or for a few files."""
    if not stream.isatty():
        yield
        return
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn

    from nccl_doctor.capture.capture_set import reading_progress

    bar = Progress(TextColumn("reading captures"), BarColumn(), MofNCompleteColumn(),
                   console=Console(file=stream), transient=True)
    task = None

    def told(done: int, total: int) -> None:
        nonlocal task
        if total < BAR_FROM:
            return
        if task is None:
            bar.start()
            task = bar.add_task("read", total=total)
        bar.update(task, completed=done, total=total)
        if done >= total:  # a multi-node replay reads one directory after another
            bar.remove_task(task)
            task = None

    try:
        with reading_progress(told):
            yield
    finally:
        bar.stop()

HELP = ("diagnose a capture directory (the --out DIR of `nccl-doctor run`) or PyTorch Flight "
        "Recorder dumps offline")


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("replay", help=HELP, description=HELP[0].upper() + HELP[1:] + ".")
    p.add_argument("capture", type=Path, metavar="PATH", nargs="+",
                   help="capture directory, a single .ndcap capture file, or a directory of "
                        "Flight Recorder dumps (one file per rank, pickle or JSON, any prefix); "
                        "a multi-node job: every node's --out directory, or one directory "
                        "holding them")
    p.add_argument("--fr", type=Path, default=None, metavar="DIR",
                   help="the job's own Flight Recorder dumps, merged with the capture "
                        "(TORCH_FR_DUMP_TEMP_FILE's directory)")
    p.add_argument("--format", choices=FORMATS, default=None,
                   help="report format (default: the one -o FILE's extension names: .json "
                        "json, .html or .htm html (one self-contained page), .txt or .log "
                        "console; else console). An extension naming another format is an "
                        "error")
    p.add_argument("-o", "--output", type=Path, default=None, metavar="FILE",
                   help="write the report to FILE instead of stdout")
    p.add_argument("--force", action="store_true", help="overwrite FILE if it exists")
    p.add_argument("--log", type=Path, default=None, metavar="FILE",
                   help="the job's printed log: training metrics are read from it (Trainer/TRL, "
                        "ms-swift, OpenRLHF lines) when the capture recorded none")
    p.add_argument("--fail-on", choices=["suspect"], default=None,
                   help=f"exit {ExitStatus.VERDICT_FAILED} unless the verdict is ok")
    p.add_argument("--user-code", action="append", default=[], metavar="PATTERN",
                   type=code_pattern,
                   help="files matching PATTERN are your code (as `run --user-code`; by default "
                        "the patterns the run recorded)")
    p.add_argument("--library-code", action="append", default=[], metavar="PATTERN",
                   type=code_pattern,
                   help="files matching PATTERN are library code (as `run --library-code`)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    # what replay reads and writes with, imported by the replay itself: the parser of every
    # command imports this module
    from nccl_doctor.analysis import analyze
    from nccl_doctor.analysis.attempts import with_attempts
    from nccl_doctor.analysis.calls.loaded import loaded
    from nccl_doctor.capture.capture_set import CaptureSet
    from nccl_doctor.capture import metrics_log
    from nccl_doctor.cli.output import emit, verdict_status

    with reading_bar(sys.stderr):
        captures = CaptureSet(*args.capture, fr=args.fr)
        traces = loaded(captures)
    if args.log is not None:
        if not args.log.is_file():
            raise CaptureNotFound(f"--log {args.log} does not exist or is not a file")
        traces = replace(traces, metrics_log=tuple(metrics_log.parse_file(args.log)))
    _which_code(traces, args.user_code, args.library_code)
    diagnosis = with_attempts(analyze(traces), captures, analyze)
    emit(diagnosis, args.output, args.format, args.force, traces)
    return verdict_status(diagnosis, 0, args.fail_on)


def _which_code(traces, user_code: list[str], library_code: list[str]) -> None:
    """Which code is the user's, as the run decided it (the patterns and interpreter prefixes
    its ranks recorded), with this replay's own patterns added."""
    recorded: dict[str, str] = {}
    prefixes: list[str] = []
    for _, trace in sorted(traces.ranks.items()):
        for name in (paths.USER_CODE_ENV, paths.LIBRARY_CODE_ENV):
            recorded.setdefault(name, trace.meta.env.get(name, ""))
        prefixes.extend(p for p in trace.meta.prefixes if p not in prefixes)
    paths.configure_from(paths.with_patterns(recorded, user_code, library_code), prefixes)
