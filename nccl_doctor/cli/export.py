"""``nccl-doctor export PATH... -o FILE``: a recorded job's calls as a Parquet or CSV table."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from nccl_doctor.errors import OutputExists, UsageError, unwritable

HELP = ("write every recorded collective of a job (one row per call: rank, group, op, tensors, "
        "times, duration, callsite) to a Parquet or CSV file")


def register(sub: argparse._SubParsersAction) -> None:
    from nccl_doctor.data.export import FORMATS

    p = sub.add_parser("export", help=HELP, description=HELP[0].upper() + HELP[1:]
                       + ". The columns are those of nccl_doctor.open(PATH).calls "
                         "(docs/python-api.md).")
    p.add_argument("capture", type=Path, metavar="PATH", nargs="+",
                   help="what replay reads: a capture directory, a .ndcap file, Flight Recorder "
                        "dumps, or every node's directories")
    p.add_argument("-o", "--output", type=Path, required=True, metavar="FILE",
                   help="the table to write (.parquet or .csv)")
    p.add_argument("--format", choices=FORMATS, default=None,
                   help="table format (default: from FILE's suffix; a suffix naming the other "
                        "format is an error)")
    p.add_argument("--fr", type=Path, default=None, metavar="DIR",
                   help="the job's own Flight Recorder dumps: the calls only they saw are added")
    p.add_argument("--force", action="store_true", help="overwrite FILE if it exists")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from nccl_doctor.data import export
    from nccl_doctor.data.job import Job

    fmt = export.format_for(args.output, args.format)
    if args.output.exists() and not args.force:
        raise OutputExists(f"{args.output} already exists: pass --force to overwrite it")
    if args.output.is_dir():
        raise UsageError(f"-o {args.output} is a directory: name the file to write")
    job = Job(*args.capture, fr=args.fr)
    export.keep_freed_memory()
    try:
        rows = export.write(job.iter_calls, args.output, fmt)
    except ImportError:
        raise UsageError("Parquet needs pyarrow: pip install 'nccl-doctor[parquet]' "
                         "(or write CSV: -o FILE.csv)") from None
    except OSError as err:
        raise unwritable("-o", args.output, err) from None
    sys.stderr.write(f"Wrote {rows} calls to {args.output}\n")
    return 0
