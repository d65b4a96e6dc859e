"""Which arm of a test on the rank is the special case (source/polarity.py)."""

from __future__ import annotations

import pytest

from nccl_doctor.source.polarity import body_is_special


@pytest.mark.parametrize("text, names, special", [
    ("if rank == 0:", ["rank"], True),  # singles rank 0 out
    ("if batch_idx == 3 and trainer.is_global_zero:", ["trainer.is_global_zero"], True),
    ("if step == 2 and rank == skipper:", ["rank"], True),
    ("if rank != 1:  # the bug: world rank 1 skips the broadcast", ["rank"], False),
    ("elif dist.get_rank() != 0:", ["dist.get_rank()"], False),
    ("if local_rank > 0:", ["local_rank"], False),  # every rank but the first
    ("if accelerator.is_main_process:", ["accelerator.is_main_process"], True),
    ("if not accelerator.is_main_process:", ["accelerator.is_main_process"], False),
    ("if is_master:", ["is_master"], True),
    ("if rank:", ["rank"], False),  # a rank number's truth: every rank but rank 0
    ("if not rank:", ["rank"], True),
    ("if state.is_world_process_zero():", ["state.is_world_process_zero()"], True),
    ("while rank in waiting:", ["rank"], True),
    ("if debug or rank != 0:", ["rank"], False),  # the operand on the rank decides
])
def test_which_arm_singles_the_ranks_out(text, names, special):
    assert body_is_special(text, names) is special


@pytest.mark.parametrize("text, names", [
    ("if step % 10 == 0:", ["rank"]),  # nothing on the rank in it
    ("x = 1 if rank == 0 else 2", ["rank"]),  # not a header
    ("if (rank ==", ["rank"]),  # a line cut short
])
def test_what_cannot_be_read_says_none(text, names):
    assert body_is_special(text, names) is None
