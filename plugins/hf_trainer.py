"""A transformers ``TrainerCallback`` (TRL's trainers are Trainers) that records the logged
metrics of every step and marks steps for RNG fingerprints.

Under ``nccl-doctor run`` it is added to every ``Trainer`` automatically; elsewhere add it
yourself: ``trainer.add_callback(DoctorCallback())`` after ``nccl_doctor.install()``.
"""

from __future__ import annotations

from typing import Any

from transformers import TrainerCallback

from nccl_doctor.rank import hooks
class DoctorCallback(TrainerCallback):  # type: ignore[misc]
    def on_step_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        hooks.mark_step(getattr(state, "global_step", None))

    def on_log(self, args: Any, state: Any, control: Any, logs: dict | None = None,
               **kwargs: Any) -> None:
        if logs:
            hooks.observe_metrics(getattr(state, "global_step", None), logs, source="trainer")
