"""vLLM: the offline engine's ``LLM.generate``, noted like transformers' generate (token ids of
each request's outputs, the requests' seeds, the engine's tensor-parallel size)."""

from __future__ import annotations

import functools
from typing import Any

from nccl_doctor.rank import hooks
from nccl_doctor.rank.fingerprint import rng_fingerprint


def _vllm_tp(llm: Any) -> int:
    """The engine's tensor-parallel size: ranks of one TP group generate identical outputs by
    design (TRL's colocate mode), which the analysis must not call a seed bug."""
    try:
        return int(llm.llm_engine.vllm_config.parallel_config.tensor_parallel_size)
    except Exception:
        try:
            return int(llm.llm_engine.parallel_config.tensor_parallel_size)
        except Exception:
            return 1


def patch_generate(module: Any) -> None:
    """vLLM's offline ``LLM.generate``: token ids of each request's outputs, and its seeds."""
    llm = getattr(module, "LLM", None)
    fn = getattr(llm, "generate", None)
    if fn is None or getattr(fn, "__nccl_doctor__", False):
        return

    @functools.wraps(fn)
    def generate(self: Any, *args: Any, **kwargs: Any) -> Any:
        try:
            before = rng_fingerprint()
        except Exception:
            before = {}
        outputs = fn(self, *args, **kwargs)
        try:
            params = kwargs.get("sampling_params", args[1] if len(args) > 1 else None)
            first = params[0] if isinstance(params, (list, tuple)) and params else params
            temperature = getattr(first, "temperature", 1.0)
            seeds = [getattr(p, "seed", None) for p in (
                params if isinstance(params, (list, tuple)) else [params])][:hooks.MAX_ROWS]
            rows, prompts = [], []
            for request in outputs:
                prompts.append(list(getattr(request, "prompt_token_ids", None) or []))
                for completion in getattr(request, "outputs", []):
                    rows.append(list(getattr(completion, "token_ids", [])))
            hooks.observe_completions(rows, prompts,
                                      sampling=bool(temperature and temperature > 0),
                                      source="vllm", rng=before, temperature=temperature,
                                      seeds=seeds, tp=_vllm_tp(self))
        except Exception:
            pass
        return outputs

    generate.__nccl_doctor__ = True  # type: ignore[attr-defined]
    llm.generate = generate
