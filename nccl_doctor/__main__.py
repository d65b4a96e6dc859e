"""``python -m nccl_doctor``: the CLI."""

from nccl_doctor.cli.main import entry

entry()
