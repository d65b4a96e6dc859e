"""The integrations nccl-doctor installs in every rank (entry-point group
``nccl_doctor.integrations``, name ``builtin``): which module each hook waits for. Importing this
module imports none of those libraries."""

from __future__ import annotations

from nccl_doctor.plugins import accelerate_seed, hf_transformers, ray_train, roles, vllm_engine
from nccl_doctor.rank.hooks import Integration

INTEGRATIONS: tuple[Integration, ...] = (
    Integration("transformers.trainer_utils", hf_transformers.patch_set_seed),
    Integration("transformers.generation.utils", hf_transformers.patch_generate),
    Integration("transformers.trainer", hf_transformers.patch_trainer),
    Integration("accelerate.utils", accelerate_seed.patch_set_seed),
    Integration("vllm", vllm_engine.patch_generate),
    Integration("ray.train.v2._internal.execution.worker_group.thread_runner",
                ray_train.patch_thread_runner),
    Integration("torch.distributed.device_mesh", roles.patch_device_mesh),
    Integration("torch.distributed.pipelining.stage", roles.patch_pipeline_stage),
)
