"""The one error family of nccl-doctor, and the exit statuses the CLI maps it to.

Library code raises these; only ``nccl_doctor.cli`` catches them, prints one line and exits.
"""

from __future__ import annotations


class ExitStatus:
    """Documented exit statuses of the ``nccl-doctor`` command (docs/exit-status.md)."""

    OK = 0
    USAGE = 2  # bad flag or argument (argparse uses 2 as well)
    NOT_FOUND = 3  # an input path does not exist, or is empty
    NOT_A_CAPTURE = 4  # the input exists but is not an nccl-doctor capture
    UNSUPPORTED_VERSION = 5  # a capture written by an incompatible version
    CORRUPT = 6  # a capture whose data cannot be read at all
    OUTPUT_EXISTS = 7  # would overwrite an output without --force
    LAUNCH_FAILED = 8  # the job's command could not be started
    REFUSED = 9  # an input asks for something unsafe (a pickle naming code to run): not read
    UNWRITABLE = 10  # an output path cannot be created or written (--out, -o)
    IN_USE = 11  # --out is the capture directory of a run that is still live
    INTERNAL = 70  # a bug in nccl-doctor (EX_SOFTWARE)
    # `run` otherwise exits with the job's own status; this one says nccl-doctor diagnosed a hang
    # and stopped the job (--on-hang kill). Like timeout(1)'s 124: "stopped, it would not finish".
    HANG_STOPPED = 124
    # `run` / `replay` with --fail-on suspect: the job itself succeeded (or there is no job), but
    # the verdict is not ok (a silent error such as identical completions, a hang, a crash).
    VERDICT_FAILED = 123
    # `check`: the source holds findings (a collective some ranks may skip)
    CHECK_FOUND = 1
    # The reader of stdout went away (``| head``): the output was cut short, quietly, as a tool
    # killed by SIGPIPE is (128 + 13). `run` keeps the job's status instead (cli/pipes.py).
    CLOSED_PIPE = 141


class DoctorError(Exception):
    """An error a user can fix. ``str(err)`` is the whole one-line message."""

    exit_status = ExitStatus.INTERNAL


class UsageError(DoctorError):
    exit_status = ExitStatus.USAGE


class CaptureNotFound(DoctorError):
    exit_status = ExitStatus.NOT_FOUND


class InputNotFound(DoctorError):
    """An input path that does not exist (``check``'s files): as a missing capture."""
    exit_status = ExitStatus.NOT_FOUND


class NotACapture(DoctorError):
    exit_status = ExitStatus.NOT_A_CAPTURE


class UnsupportedVersion(DoctorError):
    exit_status = ExitStatus.UNSUPPORTED_VERSION


class CorruptCapture(DoctorError):
    exit_status = ExitStatus.CORRUPT


class RefusedInput(DoctorError):
    exit_status = ExitStatus.REFUSED


class OutputExists(DoctorError):
    exit_status = ExitStatus.OUTPUT_EXISTS


class LaunchFailed(DoctorError):
    exit_status = ExitStatus.LAUNCH_FAILED


class Unwritable(DoctorError):
    exit_status = ExitStatus.UNWRITABLE


class OutDirInUse(DoctorError):
    exit_status = ExitStatus.IN_USE


def unwritable(flag: str, path: object, err: OSError) -> Unwritable:
    """The one line for an output path the OS refused: the path, why, and the flag to change."""
    why = err.strerror or type(err).__name__
    if isinstance(err, NotADirectoryError):
        why = "a part of the path is a file, not a directory"
    return Unwritable(f"{flag} {path}: cannot write there ({why}); choose a writable {flag}")
