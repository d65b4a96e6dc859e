"""``degenerate_signal``: the training signal is dead (docs/bugs.md C: reward std 0, advantages 0,
loss 0, KL 0) for ``SIGNAL_STEPS`` consecutive logged steps. Pure: reads the ``metrics`` notes
of the captures (the transformers callback, ``nccl_doctor.observe_metrics``) or metrics parsed
from a training log (nccl_doctor.capture.metrics_log).

Metric names follow TRL, OpenRLHF and ms-swift. A loss of exactly 0 only counts while no reward
spread says otherwise: GRPO's loss is ~0 by construction whenever completions have equal lengths,
and Trainer logs it rounded to 4 digits.
"""

from __future__ import annotations

import math
import re
from typing import Callable, Mapping, Sequence

from nccl_doctor.diagnosis import Finding, FindingKind, Severity
from nccl_doctor.model import TraceSet

SIGNAL_STEPS = 3  # consecutive logged steps a criterion must hold

Row = tuple[int | None, Mapping[str, float]]  # (step, metrics)

HINT_SIGNAL = (
    "Nothing is being learned. If completions of a prompt are identical (see "
    "identical_completions / shared_rng_state), seed sampling per global rank. Otherwise check "
    "the reward function (constant rewards), the learning rate, and that beta > 0 when KL is "
    "expected to move."
)

_REWARD_STD = re.compile(r"(^|[/_])rewards?[/_]std$|^reward_std$|(^|/)std_reward$", re.I)
_ZERO_STD_FRAC = re.compile(r"frac_reward_zero_std$", re.I)
_ADVANTAGE = re.compile(r"adv\w*[/_](std|abs\w*)$", re.I)
_LOSS = re.compile(r"^(train/)?(loss|policy_loss|actor_loss|pg_loss)$", re.I)
_KL = re.compile(r"^(train/|objective/)?(kl|kl_div|approx_kl|kl_loss)$", re.I)


def _value(metrics: Mapping[str, float], pattern: re.Pattern[str]) -> tuple[str, float] | None:
    for key, value in metrics.items():
        if pattern.search(key):
            return key, value
    return None


def _criteria() -> list[tuple[str, Callable[[Mapping[str, float]], str | None]]]:
    def reward_std(m: Mapping[str, float]) -> str | None:
        hit = _value(m, _REWARD_STD)
        if hit is not None and hit[1] == 0:
            return f"{hit[0]} = 0"
        frac = _value(m, _ZERO_STD_FRAC)
        if frac is not None and frac[1] >= 1:
            return f"{frac[0]} = {frac[1]:g}"
        return None

    def advantages(m: Mapping[str, float]) -> str | None:
        hit = _value(m, _ADVANTAGE)
        return f"{hit[0]} = 0" if hit is not None and hit[1] == 0 else None

    def loss(m: Mapping[str, float]) -> str | None:
        spread = _value(m, _REWARD_STD)
        if spread is not None and spread[1] > 0:
            return None  # a reward spread is a live signal, whatever the rounded loss says
        hit = _value(m, _LOSS)
        return f"{hit[0]} = 0" if hit is not None and hit[1] == 0 else None

    def kl(m: Mapping[str, float]) -> str | None:
        spread = _value(m, _REWARD_STD)
        if spread is not None and spread[1] > 0:
            return None  # KL at 0 with rewards spread: the KL penalty is simply off
        hit = _value(m, _KL)
        return f"{hit[0]} = 0" if hit is not None and hit[1] == 0 else None

    return [("reward_std", reward_std), ("advantages", advantages), ("loss", loss), ("kl", kl)]


def _row(step: object, values: object) -> Row | None:
    """A (step, metrics) row with finite numbers only, or None (captures and logs are input)."""
    if not isinstance(values, Mapping):
        return None
    clean = {str(k): float(v) for k, v in values.items()
             if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)}
    if not clean:
        return None
    return (step if isinstance(step, int) and not isinstance(step, bool) else None), clean


def series_from_traces(traces: TraceSet) -> list[Row]:
    """The logged metrics of the rank that logged most (ranks log the same gathered values),
    one row per step, in order."""
    best: list[Row] = []
    for _, trace in sorted(traces.ranks.items()):
        rows = [r for n in trace.notes if n.get("note") == "metrics"
                and (r := _row(n.get("step"), n.get("values"))) is not None]
        if len(rows) > len(best):
            best = rows
    return best


def detect_degenerate_signal(traces: TraceSet, steps: int = SIGNAL_STEPS) -> list[Finding]:
    """From the captures' metrics, else from a training log given to replay (``--log``)."""
    rows = list(series_from_traces(traces)) or [
        r for step, values in traces.metrics_log if (r := _row(step, values)) is not None]
    return degenerate(rows, steps)


def degenerate(rows: Sequence[Row], steps: int = SIGNAL_STEPS) -> list[Finding]:
    """Each criterion's first run of ``steps`` consecutive logged rows where it holds."""
    hits: list[tuple[str, list[str], list[int | None]]] = []
    for name, check in _criteria():
        run: list[tuple[int | None, str]] = []
        for step, metrics in rows:
            why = check(metrics)
            run = run + [(step, why)] if why else []
            if len(run) >= steps:
                hits.append((name, [w for _, w in run], [s for s, _ in run]))
                break
    if not hits:
        return []
    names = [h[0] for h in hits]
    first_steps = hits[0][2]
    span = (f"steps {first_steps[0]}-{first_steps[-1]}"
            if None not in (first_steps[0], first_steps[-1]) else f"{steps} logged steps")
    detail = "\n".join(f"{name}: {', '.join(dict.fromkeys(whys))} for {len(whys)} consecutive "
                       f"logged steps (from step {ss[0]})" for name, whys, ss in hits)
    return [Finding(
        kind=FindingKind.DEGENERATE_SIGNAL, severity=Severity.WARNING,
        title=f"the training signal is dead: {', '.join(names)} at 0 for {steps} consecutive "
              f"logged steps ({span})",
        detail=detail, ranks=(), hint=HINT_SIGNAL,
        evidence={"criteria": names, "steps": steps,
                  "at": {name: ss for name, _, ss in hits}},
    )]
