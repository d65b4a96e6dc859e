"""In-rank hooks for silent errors: seeding calls, generation, logged metrics.

The recorder hands its ``observe`` to the hooks (``connect``) and installs them when the process
imports torch (``install``), with the integrations registered for other libraries (entry-point
group ``nccl_doctor.integrations``: plugins/integrations.py for transformers, accelerate and
vLLM). Each hook calls the original first, then - never raising into the job - writes a note:

- ``rng``: after ``torch.manual_seed``, ``random.seed``, ``numpy.random.seed`` and the libraries'
  ``set_seed`` (``seeding_patch``; the outermost of nested calls only), at the recorder's start and
  at step markers (``mark_step``): the seeding call, its seed argument and ``rng_fingerprint()``.
- ``gen``: generations (``observe_completions``: the integrations call it for transformers'
  ``generate`` and vLLM's ``LLM.generate``): whether it sampled, the RNG fingerprint *before*
  sampling, a hash per prompt row and per generated row (new tokens only).
- ``metrics``: the numbers a trainer logs (``observe_metrics``; the transformers callback in
  nccl_doctor.plugins calls it).
- ``role``: the rank's coordinates (``note_role``; plugins/roles.py calls it for a DeviceMesh
  and a pipeline stage), so that analysis compares ranks of the same role only.
"""

from __future__ import annotations

import contextlib
import functools
import sys
import threading
from typing import Any, Callable, Iterator, NamedTuple, Sequence

from nccl_doctor import paths
from nccl_doctor.rank.fingerprint import rng_fingerprint, row_digests

MAX_ROWS = 64  # row hashes kept per generation (plus one hash of all rows)
MAX_METRICS = 48  # numeric metrics kept per logged step


class Integration(NamedTuple):
    """A library's hook: ``patch(module)`` runs once ``module`` is imported (now, if it is)."""

    module: str
    patch: Callable[[Any], None]


_local = threading.local()
_observe: Callable[[str, dict[str, Any]], bool] | None = None  # the recorder's, once connected
_counts: dict[str, int] = {}
# patches of modules that were still being imported when the hooks were installed (vLLM and
# transformers import torch from their own __init__): retried at the next note
_pending: dict[str, Callable[[Any], None]] = {}


def _depth() -> int:
    return getattr(_local, "depth", 0)


def in_hook() -> bool:
    """Inside a hooked call: what it calls (a nested generate, a seeding) is not noted again."""
    return _depth() > 0


@contextlib.contextmanager
def hooked() -> Iterator[None]:
    """Mark the enclosed call as hooked (see ``in_hook``)."""
    _local.depth = _depth() + 1
    try:
        yield
    finally:
        _local.depth -= 1


def connect(observe: Callable[[str, dict[str, Any]], bool] | None) -> None:
    """Where notes go: the recorder's ``observe`` (None: nowhere)."""
    global _observe
    _observe = observe


def _note(kind: str, **fields: Any) -> bool:
    if _pending:
        retry_pending()
    observe = _observe
    return observe(kind, fields) if observe is not None else False


def exception_fields(tp: type, value: BaseException, tb: Any) -> dict[str, Any]:
    """An exception as the capture notes it: type, message, and the innermost frame of the
    traceback in the user's code."""
    site = None
    while tb is not None:
        if not paths.is_library_file(tb.tb_frame.f_code.co_filename):
            site = tb
        tb = tb.tb_next
    fields: dict[str, Any] = {"type": tp.__name__, "message": str(value)[:500]}
    if site is not None:
        fields.update(path=site.tb_frame.f_code.co_filename, line=site.tb_lineno,
                      function=site.tb_frame.f_code.co_name)
    return fields


def note_exception(value: BaseException) -> None:
    """An exception that ended the rank's work, caught by a library before sys.excepthook could
    see it (Ray Train runs the user's function on a thread and keeps its exception): noted as
    the rank's exception, as the excepthook notes the main thread's. Never raises."""
    try:
        _note("exception", **exception_fields(type(value), value, value.__traceback__))
    except Exception:  # noqa: BLE001 - never into the job
        pass


def _next(kind: str) -> int:
    _counts[kind] = _counts.get(kind, 0) + 1
    return _counts[kind]


# -- seeding -------------------------------------------------------------------------------
def _seeding(label: str, fn: Callable[..., Any]) -> Callable[..., Any]:
    if getattr(fn, "__nccl_doctor__", False):
        return fn

    @functools.wraps(fn)
    def seed(*args: Any, **kwargs: Any) -> Any:
        with hooked():
            result = fn(*args, **kwargs)
        if not in_hook():
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


def seeding_patch(owner: Any, name: str, label: str) -> None:
    """Replace the seeding function ``owner.name`` by one that notes the RNG state after it."""
    fn = getattr(owner, name, None)
    if callable(fn):
        setattr(owner, name, _seeding(label, fn))


def _patch_torch(torch: Any) -> None:
    wrapped = _seeding("torch.manual_seed", torch.random.manual_seed)
    torch.random.manual_seed = wrapped
    torch.manual_seed = wrapped


def _patch_random(random: Any) -> None:
    seeding_patch(random, "seed", "random.seed")


def _patch_numpy_random(np_random: Any) -> None:
    seeding_patch(np_random, "seed", "numpy.random.seed")


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


# -- roles ---------------------------------------------------------------------------------
#: role notes per process and kind: a job makes a few meshes and stages, not one a step (each
#: kind its own count: a torch whose mesh slices cannot be told from roots at their creation
#: must not use up the stage's room)
MAX_ROLES = 16


def note_role(what: str, **fields: Any) -> bool:
    """A coordinate of this rank: ``what`` is ``mesh`` (a DeviceMesh's dims, shape, this rank's
    coordinate, each dim's group) or ``stage`` (a pipeline stage's index, the stage count, its
    group). Returns whether it was recorded. Never raises."""
    try:
        if _counts.get(f"role.{what}", 0) >= MAX_ROLES:
            return False
        return _note("role", what=what, n=_next(f"role.{what}"), **fields)
    except Exception:
        return False


# -- installation --------------------------------------------------------------------------
#: the standard library's and numpy's seeding; the other libraries' come as integrations
STANDARD: tuple[Integration, ...] = (
    Integration("random", _patch_random),
    Integration("numpy.random", _patch_numpy_random),
)


def install(torch: Any, when_imported: Callable[[str, Callable], None],
            integrations: Sequence[Integration] = ()) -> None:
    """Patch torch now, and each integration's module now or once it is imported."""
    _safe(_patch_torch, torch)
    for name, patch in (*STANDARD, *integrations):
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
