"""PyTorch Flight Recorder dump files: read safely, one per rank, into a ``TraceSet``.

A job on torch >= 2.3 writes one dump per rank on a collective timeout
(``TORCH_NCCL_DUMP_ON_TIMEOUT=1``; files ``$TORCH_FR_DUMP_TEMP_FILE<rank>``, formerly
``TORCH_NCCL_DEBUG_INFO_TEMP_FILE``), as a pickle, or as JSON from ``_dump_nccl_trace_json`` /
``_dump_fr_trace_json``; nccl-doctor's supervisor keeps the JSON pulls it made live in a capture
directory's ``flight_recorder/`` (capture/names.py names it, capture/evidence.py reads it).

A dump is input from outside, never trusted: a pickle is read by an unpickler that builds plain
containers and scalars only and refuses any global (a class, a function: ``__reduce__`` payloads),
so reading a dump never runs code from it. What the entries mean, and how they merge with the
recorder's events, is nccl_doctor/capture/flight_recorder.py's.
"""

from __future__ import annotations

import gc
import io
import pickle
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

from nccl_doctor import bounded_json, words
from nccl_doctor.capture import flight_recorder, fr_window
from nccl_doctor.capture.unrecorded import MAX_WORLD
from nccl_doctor.errors import (
    CaptureNotFound, CorruptCapture, NotACapture, RefusedInput, UnsupportedVersion,
)
from nccl_doctor.model import (
    ExitKind, GroupInfo, Integrity, RankExit, RankMeta, RankTrace, TraceSet, Unrecorded,
)

#: Flight Recorder's format versions this reader knows ("2.0" .. "2.10" so far). A newer minor
#: version adds fields (read, with a note); another major version is refused.
MAJOR = 2
KNOWN_MINOR = 10
#: Larger files are not Flight Recorder dumps (2,000 entries with stacks: about 4 MB).
MAX_BYTES = 512 * 1024 * 1024
_RANK_IN_NAME = re.compile(r"(\d+)(?:\.(?:json|pkl|pickle))?$")


class _Refused(Exception):
    pass


class _PlainUnpickler(pickle.Unpickler):
    """Builds dicts, lists, tuples, sets, strings, bytes, numbers, bools and None. Any global
    (GLOBAL/STACK_GLOBAL/INST/OBJ/REDUCE/EXT all go through ``find_class``) or persistent id
    is refused before it is looked up, so nothing named in the file is ever imported or
    called."""

    def find_class(self, module: str, name: str) -> Any:
        raise _Refused(f"{module}.{name}")

    def persistent_load(self, pid: Any) -> Any:
        raise _Refused("a persistent id")


def loads(data: bytes, name: str) -> dict[str, Any]:
    """One dump's content (JSON or pickle), checked to be a Flight Recorder dump. ``name`` says
    which file in the errors. Raises RefusedInput, CorruptCapture, NotACapture,
    UnsupportedVersion."""
    head = data[:64].lstrip()[:1]
    if head in (b"{", b"["):
        try:
            raw = bounded_json.loads(data)
        except ValueError as err:
            raise CorruptCapture(f"{name} is damaged: {err}") from None
    elif data[:1] == b"\x80":
        try:
            # a BufferedReader: the C unpickler prefetches through its peek(); on a bare
            # BytesIO it makes one read() call per opcode (3x slower)
            raw = _PlainUnpickler(io.BufferedReader(io.BytesIO(data), 1 << 20)).load()
        except _Refused as err:
            raise RefusedInput(
                f"{name} is a pickle that asks for {err}: refused (a Flight Recorder dump holds "
                "only plain data; nothing in it was run). Use dumps you trust, or JSON dumps"
            ) from None
        except Exception as err:  # a damaged pickle raises anything: EOFError, ValueError...
            raise CorruptCapture(
                f"{name} is a truncated or damaged pickle ({type(err).__name__}): copy the dump "
                "again from the job's TORCH_FR_DUMP_TEMP_FILE location"
            ) from None
    else:
        raise NotACapture(f"{name} is neither a Flight Recorder pickle nor JSON")
    return _checked(raw, name)


def _checked(raw: Any, name: str) -> dict[str, Any]:
    if not isinstance(raw, dict):
        raise NotACapture(f"{name} is not a Flight Recorder dump (a {type(raw).__name__}, "
                          "not a mapping with \"entries\")")
    version = raw.get("version")
    if version is not None:
        major, minor = _version(version)
        if major is None:
            raise CorruptCapture(f"{name} has a Flight Recorder version of the wrong type or "
                                 f"form ({version!r}): the dump is damaged")
        if major != MAJOR:
            raise UnsupportedVersion(
                f"{name} is Flight Recorder format {version}; this nccl-doctor reads "
                f"{MAJOR}.x: replay it with a newer nccl-doctor")
    if "entries" not in raw and "pg_config" not in raw:
        raise NotACapture(f"{name} is not a Flight Recorder dump (no \"entries\")")
    entries = raw.get("entries", [])
    if not isinstance(entries, list) or not all(isinstance(e, dict) for e in entries):
        raise CorruptCapture(f"{name}: \"entries\" must be a list of mappings (it is a "
                             f"{type(entries).__name__}): the dump is damaged")
    return raw


def _version(value: Any) -> tuple[int | None, int | None]:
    if not isinstance(value, str):
        return None, None
    m = re.fullmatch(r"(\d+)\.(\d+)", value.strip())
    return (int(m.group(1)), int(m.group(2))) if m else (None, None)


def read_dump(path: Path) -> dict[str, Any]:
    """One dump file (see ``loads``)."""
    try:
        size = path.stat().st_size
        if size > MAX_BYTES:
            raise NotACapture(f"{path} is {size >> 20} MB: too large for a Flight Recorder dump")
        data = path.read_bytes()
    except OSError as err:
        raise CaptureNotFound(f"{path} cannot be read ({err.strerror})") from None
    return loads(data, str(path))


def rank_of(path: Path, dump: Mapping[str, Any]) -> int | None:
    """The rank a dump belongs to: its own ``rank`` field where it has one, else the number
    that ends the file's name (``rank_3``, ``nccl_trace_rank_3.json``, ``fr12.pkl``)."""
    rank = dump.get("rank")
    if isinstance(rank, int) and not isinstance(rank, bool) and rank >= 0:
        return rank
    m = _RANK_IN_NAME.search(path.name)
    return int(m.group(1)) if m else None


@dataclass(frozen=True)
class Dumps:
    """Every rank's dump from one place, and what could not be used."""

    by_rank: dict[int, dict[str, Any]]
    problems: tuple[str, ...] = ()
    notes: tuple[str, ...] = ()
    compared: int = 0  # entries compared across the ranks, when cut to a window (fr_window)
    kept: int = 0  # of which kept
    damaged: Mapping[int, str] = field(default_factory=dict)  # rank -> its unreadable dump


def candidates(path: Path) -> list[Path]:
    if path.is_file():
        return [path]
    return sorted(p for p in path.iterdir()
                  if p.is_file() and not p.name.startswith(".") and p.suffix not in (".txt", ".md",
                                                                                     ".log"))


def is_dump_dir(path: Path) -> bool:
    """Whether ``path`` looks like Flight Recorder dumps (a file, or a directory of them): the
    first candidate's first bytes are a pickle or a JSON object holding "entries"."""
    try:
        files = candidates(path)
    except OSError:
        return False
    for f in files[:16]:  # dumps may sit beside a note or two
        try:
            with open(f, "rb") as fh:
                head = fh.read(4096)
        except OSError:
            continue
        if head[:1] == b"\x80" or (head.lstrip()[:1] == b"{" and (
                b'"entries"' in head or b'"pg_config"' in head)):
            return True
    return False


def load_dumps(path: Path) -> Dumps:
    """Each rank's dump under ``path`` (a directory of per-rank files with any common prefix, or
    one file). A damaged file among readable ones is noted and skipped; a refused pickle
    stops the whole read (the directory is not to be trusted)."""
    if not path.exists():
        raise CaptureNotFound(f"{path} does not exist: pass a directory of Flight Recorder dumps "
                              "(one file per rank)")
    files = candidates(path)
    if not files:
        raise CaptureNotFound(f"{path} holds no files: no Flight Recorder dump to read")
    by_rank: dict[int, dict[str, Any]] = {}
    problems: list[str] = []
    notes: list[str] = []
    errors = []
    damaged: dict[int, str] = {}  # rank (its file's name says) -> its damaged dump's name
    # Millions of plain, acyclic containers: the cycle collector would rescan all that were
    # already read after every few thousand new ones (minutes at 1,024 ranks, for nothing).
    collecting = gc.isenabled()
    gc.disable()
    try:
        _read_all(files, by_rank, problems, notes, errors, damaged)
    finally:
        if collecting:
            gc.enable()
    if not by_rank:
        if len(errors) == 1:
            raise errors[0]
        raise CorruptCapture(f"none of the {len(files)} files in {path} is a readable Flight "
                             f"Recorder dump ({problems[0]})")
    return Dumps(by_rank, tuple(problems), tuple(notes),
                 damaged={r: n for r, n in damaged.items() if r not in by_rank})


def _read_all(files: list[Path], by_rank: dict[int, dict[str, Any]], problems: list[str],
              notes: list[str], errors: list, damaged: dict[int, str]) -> None:
    for f in files:
        try:
            dump = read_dump(f)
        except RefusedInput:
            raise
        except (CorruptCapture, NotACapture, UnsupportedVersion, CaptureNotFound) as err:
            errors.append(err)
            problems.append(f"{f.name} skipped: {err}")
            named = _RANK_IN_NAME.search(f.name)
            if named and isinstance(err, CorruptCapture) and int(named.group(1)) < MAX_WORLD:
                damaged.setdefault(int(named.group(1)), f.name)
            continue
        rank = rank_of(f, dump)
        if rank is None:
            problems.append(f"{f.name} skipped: no rank in its name or content (name the "
                            "files <prefix><rank>, as torch does)")
            continue
        if rank in by_rank:
            problems.append(f"{f.name} skipped: a second dump of rank {rank}")
            continue
        _, minor = _version(dump.get("version"))
        if minor is not None and minor > KNOWN_MINOR and not notes:
            notes.append(f"Flight Recorder format {dump['version']} is newer than this "
                         f"nccl-doctor knows ({MAJOR}.{KNOWN_MINOR}): fields it adds are ignored")
        by_rank[rank] = dump


def groups_of(dumps: Mapping[int, Mapping[str, Any]]) -> dict[str, GroupInfo]:
    """The process groups the dumps' ``pg_config`` declare (name -> ranks, description)."""
    groups: dict[str, GroupInfo] = {}
    for dump in dumps.values():
        config = dump.get("pg_config")
        if not isinstance(config, dict):
            continue
        for key, pg in config.items():
            if not isinstance(pg, dict):
                continue
            ranks = pg.get("ranks")
            if isinstance(ranks, str):
                try:
                    ranks = bounded_json.loads(ranks)
                except ValueError:
                    ranks = None
            if not isinstance(ranks, list) or not all(
                    isinstance(r, int) and not isinstance(r, bool) and 0 <= r < MAX_WORLD
                    for r in ranks):
                continue  # (a rank no process could have: a damaged dump's)
            name = str(pg.get("name", key))
            if name not in groups or len(ranks) > len(groups[name].ranks):
                groups[name] = GroupInfo(name, tuple(ranks), "", str(pg.get("desc", "")))
    return groups


def traces_from_dumps(dumps: Dumps, source: str) -> TraceSet:
    """A ``TraceSet`` of the dumps alone: each rank's collectives as Flight Recorder saw them,
    callsites from the entries' stacks. The ranks are taken as still running (a dump is written
    while the job lives, on a timeout); ranks of the groups with no dump are named."""
    groups = groups_of(dumps.by_rank)
    collecting = gc.isenabled()
    gc.disable()  # see load_dumps
    try:
        by_rank, kept, total = fr_window.trim(dumps.by_rank)
    finally:
        if collecting:
            gc.enable()
    backend = {"nccl" if flight_recorder.has_nccl(by_rank) else "gloo"}
    groups = {n: GroupInfo(g.name, g.ranks, next(iter(backend)), g.desc) for n, g in groups.items()}
    members = {r for g in groups.values() for r in g.ranks}
    stray = sorted(r for r in by_rank if members and r > max(members))
    if stray:  # (a copy named rank_0_copy827354: the job's groups end at their last member)
        by_rank = {r: d for r, d in by_rank.items() if r not in stray}
    world = max(members | set(by_rank), default=-1) + 1
    ranks = {}
    for rank, dump in sorted(by_rank.items()):
        events = tuple(flight_recorder.events_from_dump(dump))
        meta = RankMeta(rank=rank, world_size=world, local_rank=None, node_rank=None, host="",
                        pid=0, started_ns=0,
                        versions={"nccl": str(dump["comm_lib_version"])}
                        if isinstance(dump.get("comm_lib_version"), str) else {})
        ranks[rank] = RankTrace(meta, events, RankExit(ExitKind.RUNNING), Integrity(),
                                path=f"{source}#rank{rank}")
    notes = list(dumps.notes)
    if stray:
        notes.append(f"dump(s) of rank(s) {words.ranges(stray)} skipped: past every process group "
                     f"of the job (its ranks end at {world - 1}): a stray or damaged file")
    total, kept = max(total, dumps.compared), kept if not dumps.compared else dumps.kept
    if kept < total:
        notes.append(f"Flight Recorder: {total} entries compared across the ranks; the "
                     f"{kept} from just before the first divergence on are analysed")
    believed = {r: n for r, n in dumps.damaged.items() if not members or r <= max(members)}
    world = max([world, *(r + 1 for r in believed)])
    unseen = {r: Unrecorded(why=f"its Flight Recorder dump {name} is damaged", damaged=True)
              for r, name in sorted(believed.items())}
    missing = sorted(set(range(world)) - set(by_rank) - set(unseen))
    if missing:
        notes.append(f"no Flight Recorder dump for rank(s) {words.ranges(missing)}: what they "
                     "did is unknown (their peers' entries still say which collectives they "
                     "missed)")
    return TraceSet(ranks=ranks, groups=groups, world_size=world, source=source,
                    problems=tuple(dumps.problems) + tuple(notes), unrecorded=unseen)
