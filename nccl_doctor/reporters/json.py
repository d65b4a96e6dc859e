from __future__ import annotations

import json
from typing import TextIO

from nccl_doctor.diagnosis import Diagnosis


class JsonReporter:
    """``report.json``: the schema of docs/report-schema.md."""

    def render(self, diagnosis: Diagnosis, stream: TextIO, *, color: bool = False) -> None:
        json.dump(diagnosis.to_json(), stream, indent=2, sort_keys=False)
        stream.write("\n")
