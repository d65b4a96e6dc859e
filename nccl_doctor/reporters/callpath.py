"""A finding's call path as lines of text (console, HTML, the pytest plugin's failure text).

Rendering only: the frames, their packages and versions come from the analysis
(``Finding.call_path``, analysis/wording.call_fields).
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

from nccl_doctor.location import Location

#: Frames shown before the rest of a long path is elided (report.json keeps them all).
SHOWN = 8


def frame_text(frame: Mapping[str, Any]) -> str:
    """``trl/trainer/cpo_trainer.py:839 in get_batch_loss_metrics (trl 0.16.1)``."""
    try:
        loc = Location(str(frame.get("path", "?")), int(frame.get("line") or 0),
                       str(frame.get("function") or ""))
    except (TypeError, ValueError):
        return "?"
    text = loc.text("in") if loc.function else loc.text()
    package, version = frame.get("package"), frame.get("version")
    if package:
        text += f" ({package} {version})" if version else f" ({package})"
    return text


def path_lines(frames: Sequence[Mapping[str, Any]]) -> list[str]:
    """One line per frame, innermost first (``<-`` before each caller), elided past SHOWN."""
    if len(frames) < 2:
        return []
    lines = [frame_text(f) for f in frames[:SHOWN]]
    if len(frames) > SHOWN:
        lines.append(f"... {len(frames) - SHOWN} more frame(s) in report.json")
    return [lines[0]] + [f"<- {line}" for line in lines[1:]]
