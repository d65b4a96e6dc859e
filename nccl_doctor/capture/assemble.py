"""One ``TraceSet`` from what was read of a capture directory: each rank's trace (or why it could
not be read), the manifest, the markers of unrecorded ranks, the records of ranks that raised
before joining a process group, the GPU and stack samples beside them. Shared by the loader (replay) and the live reader (the supervisor)."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable, Sequence

from nccl_doctor.capture import format as fmt
from nccl_doctor.capture.early_exit import read_early_exits
from nccl_doctor.capture.joining import read_joinings
from nccl_doctor.capture.manifest import MANIFEST, DamagedManifest, Manifest, read_manifest
from nccl_doctor.capture.names import capture_files, named_rank, odd_captures
from nccl_doctor.capture.unrecorded import MAX_WORLD, read_unrecorded
from nccl_doctor.errors import (
    CaptureNotFound, CorruptCapture, DoctorError, NotACapture, UnsupportedVersion,
)
from nccl_doctor.gpu.readings import GpuTrace
from nccl_doctor.gpu.series import GPU_JSONL, read_gpu
from nccl_doctor.capture.union import Attempt
from nccl_doctor.model import EarlyExit, GroupInfo, RankTrace, TraceSet, Unrecorded
from nccl_doctor.stacks.samples import STRAGGLERS_JSONL, StackSample, read_samples


def contents(path: Path, manifest_of: Callable[[Path], Manifest | None] = read_manifest,
             ) -> tuple[Manifest | None, list[Path], list[str]]:
    """(the manifest, the capture files, notes) of a capture directory or file. A damaged
    manifest beside captures is a note: the captures that read fine are replayed.
    ``manifest_of``: how the manifest is read (a ``CaptureSet`` reads it once)."""
    if not path.exists():
        raise CaptureNotFound(
            f"{path} does not exist: pass the --out directory of an `nccl-doctor run`"
        )
    if not path.is_file() and not path.is_dir():
        raise NotACapture(f"{path} is neither a file nor a directory: pass a capture directory "
                          f"or a {fmt.CAPTURE_SUFFIX} file")
    if path.is_file():
        if path.suffix != fmt.CAPTURE_SUFFIX:
            raise NotACapture(
                f"{path} is not a capture: pass a capture directory or a {fmt.CAPTURE_SUFFIX} file"
            )
        return None, [path], []
    if not any(path.iterdir()):
        raise CaptureNotFound(f"{path} is empty: it holds no capture (was the job ever run?)")
    files, odd = capture_files(path), odd_captures(path)
    try:
        manifest = manifest_of(path)
    except DamagedManifest as err:
        if not files:
            raise
        # as if there were none (a job that may still run): the captures say the rest
        return None, files, [f"{MANIFEST} is damaged ({err.why}): reconstructed from the "
                             "captures; the command, exit status and end time are unknown",
                             *odd]
    if manifest is None and not files:
        raise NotACapture(
            f"{path} is not an nccl-doctor capture directory "
            f"(no {MANIFEST}, no *{fmt.CAPTURE_SUFFIX} files) nor a directory of PyTorch "
            "Flight Recorder dumps"
        )
    return manifest, files, odd


def beside(path: Path) -> tuple[GpuTrace | None, tuple[StackSample, ...], list[str]]:
    """The GPU samples and the stragglers' stack samples beside the captures."""
    gpu, samples, problems = None, (), []
    if path.is_dir():
        try:
            gpu = read_gpu(path)
        except ValueError as err:
            problems.append(f"GPU samples skipped: {err}")
        if gpu is not None and gpu.damaged:
            problems.append(f"{GPU_JSONL} is damaged: {gpu.damaged}; the other samples used")
        samples, damaged = read_samples(path)
        if damaged:
            problems.append(f"{STRAGGLERS_JSONL} is damaged: {damaged}; the other samples used")
    return gpu, samples, problems


def assemble(path: Path, manifest: Manifest | None, files: list[Path],
             read: list[RankTrace | DoctorError | None], gpu: GpuTrace | None,
             samples: tuple[StackSample, ...], beside_problems: list[str],
             notes: Sequence[str] = (), attempt: Attempt | None = None) -> TraceSet:
    """The ``TraceSet`` of what was read from ``files``: for each, a trace, why not, or None for
    a rank's older capture passed over (``union.newest_per_rank``); ``notes``: what the reader
    says of them (the captures passed over, a window). Each rank's end as its capture says it
    (analysis/calls/ends.py decides the rest). ``attempt``: the launch attempt the chosen
    captures are of, whose records of ranks that raised or hung before their capture existed
    are read (None: the latest of each rank, whichever attempt)."""
    traces: dict[int, RankTrace] = {}
    problems: list[str] = []
    errors: list[DoctorError] = []
    unreadable: dict[int, Unrecorded] = {}  # rank -> its capture, which cannot be read
    for file, trace in zip(files, read):
        if trace is None:
            continue
        if isinstance(trace, DoctorError):
            errors.append(trace)
            named = named_rank(file)  # (another version beside readable ones: damage too)
            if named is None:
                problems.append(str(trace))
            else:
                unreadable[named[0]] = Unrecorded(why=f"its capture {file.name} is damaged "
                                                  f"({_why(trace, file)})", host=named[1],
                                                  damaged=True)
            continue
        traces[trace.rank] = trace
    problems += notes
    if files and len(errors) == len(files):  # (a capture passed over is readable)
        if all(isinstance(e, UnsupportedVersion) for e in errors):
            raise errors[0]
        if len(errors) == 1:
            raise errors[0]
        raise CorruptCapture(
            f"none of the {len(files)} capture files in {path} can be read ({errors[0]})"
        )
    for rank, trace in sorted(traces.items()):
        if trace.integrity.damaged:
            problems.append(
                f"rank {rank}'s capture {Path(trace.path).name} is damaged "
                f"({trace.integrity.describe()}): what it still held was used, what it lost "
                f"is not evidence against rank {rank}; the diagnosis is partial")
        elif not trace.integrity.complete:
            problems.append(
                f"rank {rank}'s capture is incomplete ({trace.integrity.describe()}): "
                "its last events may be missing"
            )
    problems += beside_problems
    markers: dict[int, tuple[Unrecorded, int]] = {}
    if path.is_dir():
        markers, bad = read_unrecorded(path)
        problems += bad
    unrecorded = {r: u for r, (u, _) in sorted(markers.items()) if r not in traces}
    early, early_exits = _early_exits(path, traces, unrecorded, problems, attempt)
    joining = {r: j for r, j in (read_joinings(path, attempt) if path.is_dir() else {}).items()
               if r not in traces and r not in early_exits}
    sizes = [t.meta.world_size for t in traces.values()]
    sizes += [j.world_size for j in joining.values()]
    sizes += [markers[r][1] for r in unrecorded]
    sizes += [early[r][1] for r in early_exits]
    if manifest is not None and manifest.world_size:
        sizes.append(manifest.world_size)
    known = max((n for n in sizes if n <= MAX_WORLD), default=0)
    for rank, u in sorted(unreadable.items()):
        if rank in traces:
            continue
        if known and rank >= known:  # a name past the job's ranks: not a rank of this job
            problems.append(f"{u.why.removeprefix('its capture ')}; its name gives rank {rank}, "
                            f"past the job's {known} ranks: skipped")
            continue
        unrecorded[rank] = u
    # a damaged file whose name is not its rank's (names swapped, another rank's capture read
    # under it) may hold any rank that has no capture here: none of them is blamed
    astray = [f for f, t in zip(files, read) if isinstance(t, DoctorError)
              and (named_rank(f) is None or named_rank(f)[0] in traces)]
    world = max([known, *(r + 1 for r in (*unrecorded, *early_exits))])
    if astray:
        why = (f"a capture that cannot be read ({', '.join(f.name for f in astray[:3])}) may be "
               "its")
        unrecorded.update((r, Unrecorded(why=why, damaged=True)) for r in range(world)
                          if r not in traces and r not in unrecorded and r not in early_exits)
    node = manifest.extra.get("node") if manifest is not None else None
    partial = ""
    if isinstance(node, dict) and len(traces) < world:
        partial = (f"the captures of host {node.get('host', '?')} only (node "
                   f"{node.get('node_rank', '?')} of a multi-node job; replay every node's "
                   "directory together for the whole job)")
    return TraceSet(
        partial=partial, unrecorded=unrecorded, early_exits=early_exits,
        # (a rank that returned from init but could not make its capture is unrecorded)
        joining={r: j for r, j in joining.items() if r not in unrecorded},
        ranks=traces, groups=groups_from_notes(traces.values()), world_size=world,
        command=manifest.shown_command if manifest else (), problems=tuple(problems),
        exit_status=manifest.exit_status if manifest else None, source=str(path), gpu=gpu,
        stack_samples=samples,
    )


def _early_exits(path: Path, traces: dict[int, RankTrace], unrecorded: dict[int, Unrecorded],
                 problems: list[str], attempt: Attempt | None
                 ) -> tuple[dict[int, tuple[EarlyExit, int]], dict[int, EarlyExit]]:
    """(every record read, with its world size; those the analysis uses) of the ranks that
    raised before joining a process group. A rank that also joined (it has a capture, or a
    marker of one it could not make) is told by that: its record is another process's (a
    launcher's earlier attempt, a process the rank started)."""
    if not path.is_dir():
        return {}, {}
    early, bad = read_early_exits(path, attempt)
    problems += bad
    used = {}
    for rank, (ended, _) in sorted(early.items()):
        if rank in traces or rank in unrecorded:
            problems.append(f"rank {rank} (pid {ended.pid}) raised {ended.exception} before "
                            f"joining a process group, but rank {rank} joined in another "
                            "process (a launcher's restart?): that one is reported")
            continue
        used[rank] = ended
    return early, used


def groups_from_notes(traces: Any) -> dict[str, GroupInfo]:
    groups: dict[str, GroupInfo] = {}
    for trace in traces:
        for note in trace.notes:
            if note.get("note") != "group" or not isinstance(note.get("name"), str):
                continue
            ranks, name = note.get("ranks"), note["name"]
            if not isinstance(ranks, list) or (name in groups and
                                               len(ranks) <= len(groups[name].ranks)):
                continue  # (every rank notes the world group: check each layout once)
            if not all(isinstance(r, int) for r in ranks):
                continue
            if name not in groups or len(ranks) > len(groups[name].ranks):
                groups[name] = GroupInfo(
                    name, tuple(ranks), str(note.get("backend", "")), str(note.get("desc", ""))
                )
    return groups


def _why(error: DoctorError, file: Path) -> str:
    """What is wrong with an unreadable capture, in words that do not repeat its path."""
    text = str(error).replace(str(file), "").strip(" :")
    for lead in ("is ", "has "):
        if text.startswith(lead):
            text = text[len(lead):]
    try:
        size = file.stat().st_size
    except OSError:
        return text
    if size == 0:
        return "empty: 0 bytes"
    if size < fmt.HEADER_SIZE and isinstance(error, CorruptCapture):
        return f"truncated at {size:,} bytes, inside its {fmt.HEADER_SIZE:,}-byte header"
    return f"{text}; {size:,} bytes"
