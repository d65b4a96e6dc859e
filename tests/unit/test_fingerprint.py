"""RNG fingerprints read only what the process already imported (rank/fingerprint.py)."""

from __future__ import annotations

import json
import subprocess
import sys


def test_numpy_s_generator_is_read_only_once_the_job_used_it():
    probe = """
import json, sys
import numpy
from nccl_doctor.rank.fingerprint import rng_fingerprint
before = rng_fingerprint()
imported = "numpy.random" in sys.modules
numpy.random.seed(7)
seeded = rng_fingerprint()["numpy"]
numpy.random.seed(7)
again = rng_fingerprint()["numpy"]
numpy.random.seed(8)
other = rng_fingerprint()["numpy"]
print(json.dumps([sorted(before), imported, seeded == again, seeded != other]))
"""
    before, imported, same, differs = json.loads(subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, check=True).stdout)
    assert "numpy" not in before and not imported  # never used: neither read nor imported
    assert same and differs  # once used, its state is read: the same seed, the same digest
