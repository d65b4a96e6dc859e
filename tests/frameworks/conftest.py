"""The ``frameworks`` tier: a heavy tier, run by ``make test-all`` (NCCL_DOCTOR_FRAMEWORKS=1) or
selected by name (``pytest -m frameworks tests/frameworks``); elsewhere (``make test``) each of
its tests is skipped with the reason."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

# the upstream tier's environments (envs.py) import as a top-level module
sys.path.insert(0, str(Path(__file__).parents[1] / "upstream"))

#: Set to 1 to run the tier without naming it in ``-m`` (make test-all).
RUN_ENV = "NCCL_DOCTOR_FRAMEWORKS"


def _selected(config: pytest.Config) -> bool:
    return ("frameworks" in (config.getoption("markexpr", "") or "")
            or os.environ.get(RUN_ENV) == "1")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if _selected(config):
        return
    skip = pytest.mark.skip(reason="frameworks tier: run by make test-all, or alone with "
                            "pytest -m frameworks tests/frameworks")
    for item in items:
        if item.get_closest_marker("frameworks") is not None:
            item.add_marker(skip)
