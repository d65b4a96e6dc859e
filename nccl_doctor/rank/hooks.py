"""In-rank hooks for silent errors: seeding calls, generation, logged metrics.

Installed by the recorder when the process imports torch (``install``). Each hook calls the
original first, then - never raising into the job - writes a note into the rank's capture:

- ``rng``: after ``torch.manual_seed``, ``random.seed``, ``numpy.random.seed``,
  ``transformers.set_seed`` and ``accelerate.utils.set_seed`` (the outermost of nested calls
  only), at the recorder's start and at step markers (``mark_step``): the seeding call, its seed
  argument and ``rng_fingerprint()``.
- ``gen``: every ``generate`` of a transformers model (and vLLM's ``LLM.generate`` when vLLM is
  imported): whether it sampled, the RNG fingerprint *before* sampling, a hash per prompt row and
  per generated row (new tokens only).
- ``metrics``: the numbers a trainer logs (``observe_metrics``; the transformers callback in
  nccl_doctor.plugins calls it).
"""

from __future__ import annotations

import functools
import sys
import threading
from typing import Any, Callable

from nccl_doctor.rank.fingerprint import rng_fingerprint, row_digests

MAX_ROWS = 64  # row hashes kept per generation (plus one hash of all rows)
MAX_METRICS = 48  # numeric metrics kept per logged step

_local = threading.local()
_recorder: Any = None
_counts: dict[str, int] = {}
# patches of modules that were still being imported when the hooks were installed (vLLM and
# transformers import torch from their own __init__): retried at the next note
_pending: dict[str, Callable[[Any], None]] = {}


def _depth() -> int:
    return getattr(_local, "depth", 0)


def _note(kind: str, **fields: Any) -> bool:
    if _pending:
        retry_pending()
    rec = _recorder
    if rec is None:
        from nccl_doctor.rank import bootstrap
        rec = bootstrap.recorder()
    if rec is None or not rec.enabled:
        return False
    return rec.observe(kind, fields)


def _next(kind: str) -> int:
    _counts[kind] = _counts.get(kind, 0) + 1
    return _counts[kind]


# -- seeding -------------------------------------------------------------------------------
def _seeding(label: str, fn: Callable[..., Any]) -> Callable[..., Any]:
    if getattr(fn, "__nccl_doctor__", False):
        return fn

    @functools.wraps(fn)
    def seed(*args: Any, **kwargs: Any) -> Any:
        _local.depth = _depth() + 1
        try:
            result = fn(*args, **kwargs)
        finally:
            _local.depth -= 1
        if _local.depth == 0:
            try:
                value = args[0] if args else kwargs.get("seed", kwargs.get("a"))
                extra = {k: v for k, v in kwargs.items()
                         if k in ("device_specific", "deterministic") and isinstance(v, bool)}
                _note("rng", label=label, n=_next("rng"),
                      seed=value if isinstance(value, (int, float, str, type(None))) else repr(
                          value)[:40], fp=rng_fingerprint(), **extra)
            except Exception:
                pass
        return result

    seed.__nccl_doctor__ = True  # type: ignore[attr-defined]
    return seed


def _patch_attr(owner: Any, name: str, label: str) -> None:
    fn = getattr(owner, name, None)
    if callable(fn):
        setattr(owner, name, _seeding(label, fn))


def _patch_torch(torch: Any) -> None:
    wrapped = _seeding("torch.manual_seed", torch.random.manual_seed)
    torch.random.manual_seed = wrapped
    torch.manual_seed = wrapped


def _patch_random(random: Any) -> None:
    _patch_attr(random, "seed", "random.seed")


def _patch_numpy_random(np_random: Any) -> None:
    _patch_attr(np_random, "seed", "numpy.random.seed")


def _patch_transformers_seed(trainer_utils: Any) -> None:
    _patch_attr(trainer_utils, "set_seed", "transformers.set_seed")
    top = sys.modules.get("transformers")
    # the lazy top-level module caches attributes once read: replace a cached copy too
    if top is not None and "set_seed" in getattr(top, "__dict__", {}):
        top.__dict__["set_seed"] = trainer_utils.set_seed


def _patch_accelerate(utils: Any) -> None:
    random_mod = sys.modules.get("accelerate.utils.random")
    if random_mod is not None:
        _patch_attr(random_mod, "set_seed", "accelerate.utils.set_seed")
        utils.set_seed = random_mod.set_seed
    else:
        _patch_attr(utils, "set_seed", "accelerate.utils.set_seed")


def mark_start() -> bool:
    """The fingerprint when the rank's capture is created (its process group exists)."""
    try:
        retry_pending()
        return _note("rng", label="init", n=_next("rng"), fp=rng_fingerprint())
    except Exception:
        return False


def mark_step(step: int | None = None) -> bool:
    """A step marker: the RNG fingerprint now, labelled ``step``. Cheap (a few hashes)."""
    try:
        return _note("rng", label="step", n=_next("rng"), step=step, fp=rng_fingerprint())
    except Exception:
        return False


# -- generation ----------------------------------------------------------------------------
def observe_completions(completions: Any, prompts: Any = None, *, sampling: bool = True,
                        step: int | None = None, source: str = "user",
                        rng: dict[str, str] | None = None, **extra: Any) -> bool:
    """Record hashes of one batch of generations (strings, token-id lists or a 2-D tensor of
    new tokens) and of their prompts. ``sampling`` False marks deterministic decoding (greedy,
    temperature 0), whose identical outputs are expected. Returns whether it was recorded (False
    outside nccl-doctor). Never raises."""
    try:
        rows, every, nrows = row_digests(completions, MAX_ROWS)
        prompt_rows, prompts_all = [], ""
        if prompts is not None:
            prompt_rows, prompts_all, _ = row_digests(prompts, MAX_ROWS)
        return _note(
            "gen", n=_next("gen"), source=source, sample=bool(sampling), step=step,
            rows=rows, all=every, nrows=nrows, prompts=prompt_rows, prompts_all=prompts_all,
            rng=rng if rng is not None else rng_fingerprint(), **extra,
        )
    except Exception:
        return False


def _sampling_of(model: Any, kwargs: dict[str, Any]) -> tuple[bool, float | None]:
    config = kwargs.get("generation_config") or getattr(model, "generation_config", None)
    do_sample = kwargs.get("do_sample", getattr(config, "do_sample", False))
    temperature = kwargs.get("temperature", getattr(config, "temperature", None))
    sampling = bool(do_sample) and not (temperature is not None and temperature <= 0)
    return sampling, float(temperature) if isinstance(temperature, (int, float)) else None


def _patch_generate(utils: Any) -> None:
    mixin = getattr(utils, "GenerationMixin", None)
    fn = getattr(mixin, "generate", None)
    if fn is None or getattr(fn, "__nccl_doctor__", False):
        return

    @functools.wraps(fn)
    def generate(self: Any, *args: Any, **kwargs: Any) -> Any:
        if _depth():
            return fn(self, *args, **kwargs)
        try:
            before = rng_fingerprint()
        except Exception:
            before = {}
        _local.depth = _depth() + 1
        try:
            out = fn(self, *args, **kwargs)
        finally:
            _local.depth -= 1
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
    observe_completions(new, prompt if hasattr(prompt, "dim") else None, sampling=sampling,
                        source="transformers", rng=before, temperature=temperature)


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


def _patch_vllm(module: Any) -> None:
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
                params if isinstance(params, (list, tuple)) else [params])][:MAX_ROWS]
            rows, prompts = [], []
            for request in outputs:
                prompts.append(list(getattr(request, "prompt_token_ids", None) or []))
                for completion in getattr(request, "outputs", []):
                    rows.append(list(getattr(completion, "token_ids", [])))
            observe_completions(rows, prompts, sampling=bool(temperature and temperature > 0),
                                source="vllm", rng=before, temperature=temperature, seeds=seeds,
                                tp=_vllm_tp(self))
        except Exception:
            pass
        return outputs

    generate.__nccl_doctor__ = True  # type: ignore[attr-defined]
    llm.generate = generate


# -- metrics -------------------------------------------------------------------------------
def observe_metrics(step: int | None, metrics: dict[str, Any], *, source: str = "user") -> bool:
    """Record the numbers logged at ``step`` (non-numbers are dropped). Never raises."""
    try:
        values = {}
        for key, value in metrics.items():
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                value = getattr(value, "item", lambda: None)() if hasattr(value, "numel") and \
                    value.numel() == 1 else None
            if isinstance(value, (int, float)) and not isinstance(value, bool):
                values[str(key)[:80]] = float(value)
            if len(values) >= MAX_METRICS:
                break
        if not values:
            return False
        return _note("metrics", step=step, source=source, values=values)
    except Exception:
        return False


def _patch_trainer(trainer_module: Any) -> None:
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


# -- installation --------------------------------------------------------------------------
#: module -> how to patch it, applied now if imported, else right after its import
PATCHES: dict[str, Callable[[Any], None]] = {
    "random": _patch_random,
    "numpy.random": _patch_numpy_random,
    "transformers.trainer_utils": _patch_transformers_seed,
    "transformers.generation.utils": _patch_generate,
    "transformers.trainer": _patch_trainer,
    "accelerate.utils": _patch_accelerate,
    "vllm": _patch_vllm,
}


def install(recorder: Any, torch: Any, when_imported: Callable[[str, Callable], None]) -> None:
    """Patch torch now, and each module of PATCHES now or once it is imported."""
    global _recorder
    _recorder = recorder
    _safe(_patch_torch, torch)
    for name, patch in PATCHES.items():
        guarded = functools.partial(_safe, patch)
        module = sys.modules.get(name)
        if module is None:
            when_imported(name, guarded)
        elif getattr(getattr(module, "__spec__", None), "_initializing", False):
            _pending[name] = guarded  # half-built: what it defines is not there yet
        else:
            guarded(module)


def retry_pending() -> None:
    """Patch the modules whose import has finished since ``install``."""
    for name, patch in list(_pending.items()):
        module = sys.modules.get(name)
        if module is None or getattr(getattr(module, "__spec__", None), "_initializing", False):
            continue
        del _pending[name]
        patch(module)


def _safe(patch: Callable[[Any], None], module: Any) -> None:
    """A hook that cannot be installed is left out; the user's import never fails for it."""
    try:
        patch(module)
    except Exception:
        pass
