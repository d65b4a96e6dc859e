"""A finding's call path as lines of text (console, HTML, the pytest plugin's failure text).

Rendering only: the frames, their packages and versions come from the analysis
(``Finding.call_path``, analysis/wording.call_fields).
"""

from __future__ import annotations

from typing import Sequence

from nccl_doctor.location import Location
from nccl_doctor.sections import CallFrame

#: Frames shown before the rest of a long path is elided (report.json keeps them all).
SHOWN = 8


def frame_text(frame: CallFrame) -> str:
    """``trl/trainer/cpo_trainer.py:839 in get_batch_loss_metrics (trl 0.16.1)``."""
    loc = Location(frame.path, frame.line, frame.function)
    text = loc.text("in") if loc.function else loc.text()
    package, version = frame.package, frame.version
    if package:
        text += f" ({package} {version})" if version else f" ({package})"
    return text


def path_lines(frames: Sequence[CallFrame]) -> list[str]:
    """One line per frame, innermost first (``<-`` before each caller), elided past SHOWN."""
    if len(frames) < 2:
        return []
    lines = [frame_text(f) for f in frames[:SHOWN]]
    if len(frames) > SHOWN:
        lines.append(f"... {len(frames) - SHOWN} more frame(s) in report.json")
    return [lines[0]] + [f"<- {line}" for line in lines[1:]]
