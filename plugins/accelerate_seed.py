"""accelerate: its ``set_seed`` noted like torch's (nccl_doctor.rank.hooks)."""

from __future__ import annotations

import sys
from typing import Any

from nccl_doctor.rank import hooks


def patch_set_seed(utils: Any) -> None:
    random_mod = sys.modules.get("accelerate.utils.random")
    if random_mod is not None:
        hooks.seeding_patch(random_mod, "set_seed", "accelerate.utils.set_seed")
        utils.set_seed = random_mod.set_seed
    else:
        hooks.seeding_patch(utils, "set_seed", "accelerate.utils.set_seed")
