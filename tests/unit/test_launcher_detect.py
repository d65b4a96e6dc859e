"""torch's own launcher gets no recorder (it starts ranks and is none): told apart from a rank by
how its interpreter was started (``sys.orig_argv``), before torch is imported."""

from __future__ import annotations

import pytest

from nccl_doctor.rank.bootstrap import is_launcher


@pytest.mark.parametrize("argv, launcher", [
    (["python", "-m", "torch.distributed.run", "--nproc-per-node", "2", "train.py"], True),
    (["python", "-u", "-m", "torch.distributed.launch", "train.py"], True),
    (["python", "/venv/bin/torchrun", "--nproc-per-node", "2", "train.py"], True),
    (["python", "train.py", "-m", "torch.distributed.run"], False),  # a rank's own arguments
    (["python", "-m", "torch.distributed.elastic.agent"], False),
    (["python", "-c", "import torch.distributed.run"], False),
    (["python", "/home/u/torchrun_notes.py"], False),
    (["python"], False),
])
def test_only_torchs_launcher_is_one(argv, launcher):
    assert is_launcher(argv) is launcher
