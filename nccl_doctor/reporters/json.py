from __future__ import annotations

import json
import os
from pathlib import Path
from typing import TextIO

from nccl_doctor.diagnosis import Diagnosis


class JsonReporter:
    """``report.json``: the schema in README.md, "report.json"."""

    def render(self, diagnosis: Diagnosis, stream: TextIO, *, color: bool = False) -> None:
        json.dump(diagnosis.to_json(), stream, indent=2, sort_keys=False)
        stream.write("\n")


def write_report(diagnosis: Diagnosis, path: Path) -> None:
    """Write ``path`` atomically: a reader (or a job killed meanwhile) never sees half a report."""
    tmp = path.with_name(f".{path.name}.tmp")
    with tmp.open("w") as fh:
        JsonReporter().render(diagnosis, fh)
    os.replace(tmp, path)
