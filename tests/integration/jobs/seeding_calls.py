"""The seeding calls a trainer makes, before and after init_process_group, and the public API."""

import random

import numpy as np
import torch
import torch.distributed as dist
from accelerate import Accelerator
from accelerate.utils import set_seed

import nccl_doctor

random.seed(1)
np.random.seed(2)  # both before the process group (and the capture) exist
dist.init_process_group("gloo")
torch.manual_seed(3)
Accelerator(cpu=True)  # device_specific seeding asks accelerate for the process index
set_seed(4, device_specific=True)  # calls random/numpy/torch seeding inside: recorded once
nccl_doctor.mark_step(0)
assert nccl_doctor.observe_completions(["a b", "c d"], ["p", "p"], step=0)
assert nccl_doctor.observe_metrics(1, {"loss": 0.5, "reward_std": torch.tensor(0.25),
                                       "name": "x"})
dist.all_reduce(torch.ones(1))
dist.destroy_process_group()
