"""transformers: its ``set_seed``, every ``generate`` of a model, and a callback on every ``Trainer``
(TRL's trainers are Trainers), as hooks into the rank's silent-error notes (nccl_doctor.rank.hooks).

Registered in plugins/integrations.py; each patch runs once its module is imported, never imports
transformers itself, and never raises into the job.
"""

from __future__ import annotations

import functools
import sys
from typing import Any

from nccl_doctor.rank import hooks
from nccl_doctor.rank.fingerprint import rng_fingerprint


def patch_set_seed(trainer_utils: Any) -> None:
    hooks.seeding_patch(trainer_utils, "set_seed", "transformers.set_seed")
    top = sys.modules.get("transformers")
    # the lazy top-level module caches attributes once read: replace a cached copy too
    if top is not None and "set_seed" in getattr(top, "__dict__", {}):
        top.__dict__["set_seed"] = trainer_utils.set_seed


def _sampling_of(model: Any, kwargs: dict[str, Any]) -> tuple[bool, float | None]:
    config = kwargs.get("generation_config") or getattr(model, "generation_config", None)
    do_sample = kwargs.get("do_sample", getattr(config, "do_sample", False))
    temperature = kwargs.get("temperature", getattr(config, "temperature", None))
    sampling = bool(do_sample) and not (temperature is not None and temperature <= 0)
    return sampling, float(temperature) if isinstance(temperature, (int, float)) else None


def patch_generate(utils: Any) -> None:
    mixin = getattr(utils, "GenerationMixin", None)
    fn = getattr(mixin, "generate", None)
    if fn is None or getattr(fn, "__nccl_doctor__", False):
        return

    @functools.wraps(fn)
    def generate(self: Any, *args: Any, **kwargs: Any) -> Any:
        if hooks.in_hook():
            return fn(self, *args, **kwargs)
        try:
            before = rng_fingerprint()
        except Exception:
            before = {}
        with hooks.hooked():
            out = fn(self, *args, **kwargs)
        try:
            _record_generate(self, args, kwargs, out, before)
        except Exception:
            pass
        return out

    generate.__nccl_doctor__ = True  # type: ignore[attr-defined]
    mixin.generate = generate


def _record_generate(model: Any, args: tuple, kwargs: dict[str, Any], out: Any,
                     before: dict[str, str]) -> None:
    prompt = kwargs.get("input_ids")
    if prompt is None:
        prompt = kwargs.get("inputs", args[0] if args else None)
    sequences = getattr(out, "sequences", out)
    if not hasattr(sequences, "dim"):
        return
    new = sequences
    encoder_decoder = bool(getattr(getattr(model, "config", None), "is_encoder_decoder", False))
    if prompt is not None and hasattr(prompt, "dim") and not encoder_decoder:
        new = sequences[..., prompt.shape[-1]:]
    sampling, temperature = _sampling_of(model, kwargs)
    hooks.observe_completions(new, prompt if hasattr(prompt, "dim") else None, sampling=sampling,
                              source="transformers", rng=before, temperature=temperature)


def patch_trainer(trainer_module: Any) -> None:
    trainer = getattr(trainer_module, "Trainer", None)
    init = getattr(trainer, "__init__", None)
    if init is None or getattr(init, "__nccl_doctor__", False):
        return

    @functools.wraps(init)
    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        init(self, *args, **kwargs)
        try:
            from nccl_doctor.plugins.hf_trainer import DoctorCallback

            handler = getattr(self, "callback_handler", None)
            if handler is not None and not any(
                isinstance(c, DoctorCallback) for c in handler.callbacks
            ):
                self.add_callback(DoctorCallback())
        except Exception:
            pass

    __init__.__nccl_doctor__ = True  # type: ignore[attr-defined]
    trainer.__init__ = __init__
