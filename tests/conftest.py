"""The ``gpu`` tier: tests marked ``gpu`` run the reproducers and trainers on CUDA with NCCL. They
need an NVIDIA GPU that torch sees; elsewhere each is skipped with the reason (``make test``
prints skip reasons, and the session's header and last lines say whether the tier ran)."""

from __future__ import annotations

import pytest

from nccl_doctor.trainers.placement import visible_gpus

_GPUS = visible_gpus()


def _tier() -> str:
    gpus, why = _GPUS
    return (f"gpu tier: runs on {gpus} GPU{'s' if gpus > 1 else ''}" if gpus
            else f"gpu tier: skipped - {why}")


def pytest_report_header(config) -> str:
    return _tier()


def pytest_terminal_summary(terminalreporter) -> None:  # shown under -q too
    terminalreporter.write_line(_tier())


def pytest_collection_modifyitems(config, items) -> None:
    gpus, why = _GPUS
    if gpus:
        return
    skip = pytest.mark.skip(reason=f"gpu tier: {why}")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)
