"""The ``frameworks`` tier: a heavy tier, deselected from ``make test`` and run by ``make
test-all`` (``--tier all``), by ``--tier frameworks``, by naming it (``pytest tests/frameworks``,
``pytest -m frameworks``) or, as before, with ``NCCL_DOCTOR_FRAMEWORKS=1`` (tests/conftest.py
``TIERS``)."""

from __future__ import annotations

import sys
from pathlib import Path

# the upstream tier's environments (envs.py) import as a top-level module
sys.path.insert(0, str(Path(__file__).parents[1] / "upstream"))
