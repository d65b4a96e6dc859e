"""Loading a capture directory (or one capture file) for replay: every rank's capture read in
full as columns, a large job's window picked on them (capture/window.py) before any record
becomes an event, and the watchdog's kept evidence attached (capture/evidence.py)."""

from __future__ import annotations

from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import replace
from pathlib import Path
from typing import Callable, Iterator

from nccl_doctor.analysis.ends import Ending, decided
from nccl_doctor.capture import window
from nccl_doctor.capture.assemble import assemble, beside, contents, groups_from_notes
from nccl_doctor.capture.evidence import read_evidence, with_evidence
from nccl_doctor.capture.follow import Scan, scan_capture
from nccl_doctor.capture.manifest import Manifest
from nccl_doctor.capture.window import DEFAULT, Size
from nccl_doctor.errors import DoctorError, ExitStatus
from nccl_doctor.model import RankTrace, TraceSet

#: Told (captures read, captures in all) as load_capture_dir reads (replay's progress bar).
_PROGRESS: ContextVar[Callable[[int, int], None] | None] = ContextVar("nccl_doctor_reading",
                                                                     default=None)


@contextmanager
def reading_progress(told: Callable[[int, int], None]) -> Iterator[None]:
    """Within this block every ``load_capture_dir`` tells ``told`` how far it has read."""
    token = _PROGRESS.set(told)
    try:
        yield
    finally:
        _PROGRESS.reset(token)


def load_capture_dir(path: Path, *, job_ended: bool | None = None,
                     evidence: bool = True, window: Size = DEFAULT) -> TraceSet:
    """Load every rank's capture under ``path`` (a directory, or one ``.ndcap`` file).

    ``job_ended`` says whether the job is over (ranks with no exit record then count as vanished);
    by default the manifest's ``ended_at`` decides. ``evidence``: also what the live watchdog
    kept (nccl_doctor/capture/watch_record.py): its Flight Recorder pulls are merged, its
    decisions and stacks attached, and the ranks it stopped marked so. ``window``: how many
    records in all make the passes see a window of them (capture/window.py).
    """
    manifest, files, damage = contents(path)
    if job_ended is None:
        job_ended = manifest is not None and manifest.ended_at is not None
    told = _PROGRESS.get()
    scans = []
    for f in files:
        scans.append(_try(scan_capture, f))
        if told is not None:
            told(len(scans), len(files))
    read, note = windowed(scans, manifest, window)
    gpu, samples, problems = beside(path)
    loaded = assemble(path, manifest, files, read, gpu, samples, damage + problems + note)
    kept = read_evidence(path) if evidence and path.is_dir() else None
    if kept is not None:
        loaded = with_evidence(loaded, kept)
    ending = Ending.of(loaded.watch, ended=job_ended)
    stopped = manifest is not None and manifest.exit_status == ExitStatus.HANG_STOPPED
    if stopped and kept is not None and kept.watch_damaged:  # when it stopped is lost
        ending = replace(ending, stop_unknown=True)
    return decided(loaded, ending)


def windowed(scans: list[Scan | DoctorError], manifest: Manifest | None,
            size: Size) -> tuple[list[RankTrace | DoctorError], list[str]]:
    """Each capture's trace: with every record, or - past ``above`` records in all - with the
    window the passes need (capture/window.py), and a note saying so."""
    good = [s for s in scans if isinstance(s, Scan)]
    total = sum(len(s.decoded.rows) for s in good)
    if total <= size.above:
        return [s if isinstance(s, DoctorError) else s.trace() for s in scans], []
    table: dict[str, int] = {}
    latest: dict[int, Scan] = {}
    for scan in good:
        held = latest.get(scan.meta.rank)
        if held is None or held.meta.started_ns <= scan.meta.started_ns:
            latest[scan.meta.rank] = scan
    lv = {id(s): window.leaves(s.decoded.rows, s.decoded.exited,
                               window.codes(s.strings, table, s.decoded.rows)) for s in good}
    groups = groups_from_notes(latest.values())
    members = {table[name]: g.ranks for name, g in groups.items() if name in table}
    world = max([s.meta.world_size for s in good] + [manifest.world_size or 0 if manifest else 0])
    node = manifest.extra.get("node") if manifest is not None else None
    partial = isinstance(node, dict) and len(latest) < world
    points = window.focus({r: lv[id(s)] for r, s in latest.items()}, members, partial)
    tail = size.per_rank(len(good))
    out: list[RankTrace | DoctorError] = []
    kept = 0
    for scan in scans:
        if isinstance(scan, DoctorError):
            out.append(scan)
            continue
        mask = window.keep(scan.decoded.rows, lv[id(scan)], points, tail)
        kept += int(mask.sum())
        out.append(scan.trace(mask))
    return out, [f"{total} records compared across the ranks with numpy; {kept} analysed call "
                 f"by call: each rank's newest {tail} and those around each process group's "
                 "first divergence and its slowest member's last call"]


def _try(read: Callable[[Path], Scan], path: Path) -> Scan | DoctorError:
    try:
        return read(path)
    except DoctorError as err:
        return err


