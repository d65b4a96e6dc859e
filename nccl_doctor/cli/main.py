"""``nccl-doctor`` entry point: ``main(argv) -> int``."""

from __future__ import annotations

import argparse
import atexit
import importlib
import os
import sys
import threading
import traceback
from typing import NoReturn, Sequence

from nccl_doctor._version import __version__
from nccl_doctor.cli import pipes
from nccl_doctor.cli.pipes import OutputClosed
from nccl_doctor.errors import DoctorError, ExitStatus
from nccl_doctor.reporters.escape import visible

#: The commands, in the order the help lists them: each a module of this package with its
#: ``register(subparsers)``.
COMMANDS = ("run", "replay", "export", "check", "demo")


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # one line, exit status 2, like every other error
        self.exit(ExitStatus.USAGE, f"nccl-doctor: error: {message} (see nccl-doctor --help)\n")

    # The usage line is made from the parser when it is shown (cli/usage.py), never written by
    # hand: it cannot leave a flag out, and it is the synopsis the README and docs/ show.
    def format_usage(self) -> str:
        self._own_usage()
        return super().format_usage()

    def format_help(self) -> str:
        self._own_usage()
        return super().format_help()

    def _own_usage(self) -> None:
        if self.usage is None:
            from nccl_doctor.cli import usage

            made = usage.synopsis(self, usage.help_width(), prefix="usage: ")
            self.usage = made.replace("%", "%%")  # (argparse fills in %(prog)s)


def build_parser(argv: Sequence[str] | None = None) -> argparse.ArgumentParser:
    """The command line's parser; for ``argv`` that names a command, that command's alone (the
    others' modules stay unimported: 7 ms before ``run`` launches its job)."""
    parser = _Parser(
        prog="nccl-doctor",
        description="Record every rank's collectives and diagnose hangs, desyncs and crashes of "
                    "distributed PyTorch jobs.",
    )
    parser.add_argument("--version", action="version", version=f"nccl-doctor {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    named = [argv[0]] if argv and argv[0] in COMMANDS else COMMANDS
    for name in named:
        importlib.import_module(f"nccl_doctor.cli.{name}").register(sub)
    return parser


def entry() -> NoReturn:
    """The ``nccl-doctor`` command (and ``python -m nccl_doctor``): ``main``, then out at once.

    Python's own finalization of what a run imported (numpy, the analysis, rich, Jinja2) takes
    40-50 ms after the report is out, at the end of every command. What of it matters is done
    here first - the threads that are not daemons joined, the exit handlers run, the standard
    streams flushed - and the process then ends without the rest (``os._exit``)."""
    code = main()
    try:
        for thread in threading.enumerate():
            if thread is not threading.main_thread() and not thread.daemon:
                thread.join()
        atexit._run_exitfuncs()
        sys.stdout.flush()
        sys.stderr.flush()
    except BrokenPipeError:  # (the reader went away after the last write)
        code = code or pipes.closed()
    os._exit(code)


def main(argv: Sequence[str] | None = None) -> int:
    try:
        return _main(argv)
    except (OutputClosed, BrokenPipeError):  # | head: quietly, as Unix tools do
        return pipes.closed()


def _main(argv: Sequence[str] | None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    parser = build_parser(argv)
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help(sys.stderr)
        return ExitStatus.USAGE
    try:
        return int(args.func(args))
    except DoctorError as err:
        # (an error quotes its input: a path, a capture's content; control characters shown)
        pipes.say(f"nccl-doctor: error: {visible(str(err))}\n")
        return err.exit_status
    except KeyboardInterrupt:
        return 130
    except (OutputClosed, BrokenPipeError):
        raise
    except Exception as err:  # a bug of ours: one line, the traceback only on request
        if os.environ.get("NCCL_DOCTOR_DEBUG"):
            traceback.print_exc()
        pipes.say(
            f"nccl-doctor: internal error: {type(err).__name__}: {visible(str(err))} "
            "(set NCCL_DOCTOR_DEBUG=1 for the traceback, and please report it)\n"
        )
        return ExitStatus.INTERNAL
