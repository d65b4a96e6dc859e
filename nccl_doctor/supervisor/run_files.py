"""What the supervisor saw and decided, held in memory, and the files of the capture directory
that say it - ``manifest.json``, ``report.json``, ``watchdog.json``, ``stacks.json`` and
``flight_recorder/rank_<R>.json`` - each written through this one writer, when what it says
changed, and never read back: the end of the run takes the evidence from here."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any, Mapping

from nccl_doctor.capture.manifest import MANIFEST, Manifest
from nccl_doctor.capture.names import REPORT_JSON, report_path
from nccl_doctor.files import write_atomic

# The manifest is written before the job is launched (supervisor/start.py), with none of what
# the watchdog's files need: their modules are imported when the first of them is written.
if TYPE_CHECKING:
    from nccl_doctor.capture.evidence import Evidence
    from nccl_doctor.diagnosis import Diagnosis
    from nccl_doctor.stacks.rank_stack import RankStack
    from nccl_doctor.watch_log import WatchEvent, WatchLog


class RunFiles:
    def __init__(self, out_dir: Path) -> None:
        self.out_dir = out_dir
        self.manifest: Manifest | None = None
        self.report: Diagnosis | None = None  # the report.json standing now
        # the watchdog's events as typed values (what replay reads back from watchdog.json)
        self._events: tuple[WatchEvent, ...] = ()
        self._stacks: dict[int, RankStack] = {}
        self._fr: dict[int, dict[str, Any]] = {}
        self._written: dict[str, str] = {}  # file (relative) -> the text it holds

    def _write(self, name: str, text: str) -> bool:
        if self._written.get(name) == text:
            return False
        path = self.out_dir / name
        path.parent.mkdir(exist_ok=True)
        write_atomic(path, text)
        self._written[name] = text
        return True

    def write_manifest(self, manifest: Manifest) -> Path:
        self.manifest = manifest
        self._write(MANIFEST, manifest.text())
        return self.out_dir / MANIFEST

    def forget_manifest(self) -> None:
        """A launch that failed: nothing ran, nothing is left behind."""
        (self.out_dir / MANIFEST).unlink(missing_ok=True)
        self._written.pop(MANIFEST, None)
        self.manifest = None

    def write_report(self, diagnosis: Diagnosis) -> Path:
        self.report = diagnosis
        self._write(REPORT_JSON, diagnosis.to_json_text())
        return report_path(self.out_dir)

    @property
    def report_text(self) -> str:
        """``report.json``'s text as written ("" before the first report): serialised once,
        read by the live endpoint too."""
        return self._written.get(REPORT_JSON, "")

    def event(self, record: WatchEvent) -> None:
        """One more of the watchdog's decisions or actions (``watchdog.json``)."""
        from nccl_doctor.capture import watch_record
        self._events = (*self._events, record)[-watch_record.MAX_EVENTS:]
        self._write(watch_record.WATCH_JSON, watch_record.watch_text(self._events))

    def stacks(self, stacks: Mapping[int, RankStack]) -> None:
        """The stacks a decision used (``stacks.json``)."""
        from nccl_doctor.capture import watch_record
        self._stacks = dict(stacks)
        self._write(watch_record.STACKS_JSON, watch_record.stacks_text(stacks))

    def flight_recorder(self, dumps: Mapping[int, Mapping[str, Any]]) -> None:
        """Each rank's Flight Recorder pull a decision used (its newest entries)."""
        from nccl_doctor.capture import watch_record
        for rank, dump in sorted(dumps.items()):
            self._fr[rank] = watch_record.fr_kept(dump)
            self._write(watch_record.fr_name(rank), watch_record.fr_text(self._fr[rank]))

    def watch_log(self) -> WatchLog | None:
        from nccl_doctor.watch_log import WatchLog
        return WatchLog(self._events) if self._events else None

    def evidence(self) -> Evidence:
        """What replay will read from the files written here."""
        from nccl_doctor.capture.evidence import Evidence
        return Evidence(self.watch_log(), dict(self._stacks), dict(self._fr))
