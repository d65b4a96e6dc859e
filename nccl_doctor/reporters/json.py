"""The diagnosis as report.json (``--format json``)."""

from __future__ import annotations

from typing import TextIO

from nccl_doctor.diagnosis import Diagnosis


class JsonReporter:
    """``report.json``: its schema in docs/report-json.md."""

    def render(self, diagnosis: Diagnosis, stream: TextIO, *, color: bool = False) -> None:
        stream.write(diagnosis.to_json_text())
