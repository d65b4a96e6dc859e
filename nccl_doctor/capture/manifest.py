"""``manifest.json``: what a run was (its command, times, exit status, hosts, format version),
written by the supervisor when the run starts and once more when it ends; read by replay."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from nccl_doctor import redact
from nccl_doctor._version import __version__
from nccl_doctor.capture import format as fmt
from nccl_doctor.errors import CorruptCapture, NotACapture, UnsupportedVersion
from nccl_doctor.files import write_atomic
from nccl_doctor import bounded_json
from nccl_doctor.capture.names import MANIFEST

MANIFEST_FORMAT = "nccl-doctor-capture"
MANIFEST_MAX = 16 << 20  # bytes: a manifest is a few KiB (the command, the node, the captures)


@dataclass(frozen=True)
class Manifest:
    command: tuple[str, ...]  # as launched; written with its secrets masked unless not redacted
    started_at: float
    run_id: str
    format: str = MANIFEST_FORMAT
    format_version: int = fmt.FORMAT_VERSION
    tool_version: str = __version__
    ended_at: float | None = None
    exit_status: int | None = None
    world_size: int | None = None
    hosts: tuple[str, ...] = ()
    captures: tuple[str, ...] = ()
    extra: dict[str, Any] = field(default_factory=dict)
    # False: `nccl-doctor run --no-redact` stored the command verbatim (nccl_doctor/redact.py).
    # The supervisor that builds this says so through NO_REDACT, like the ranks it launches.
    redacted: bool = True  # False: `run --no-redact` (redact.wanted of the job's environment)

    @property
    def shown_command(self) -> tuple[str, ...]:
        """The command as stored and reported: its secrets masked unless not redacted."""
        return tuple(redact.argv(self.command)) if self.redacted else self.command

    def to_json(self) -> dict[str, Any]:
        d = asdict(self)
        # every writer (the supervisor, a replay finishing a lost run's manifest) masks it here
        d["command"] = list(self.shown_command)
        d["hosts"], d["captures"] = list(self.hosts), list(self.captures)
        return d

    def text(self) -> str:
        return json.dumps(self.to_json(), indent=2, sort_keys=True) + "\n"

    def write(self, directory: Path) -> Path:
        path = directory / MANIFEST
        write_atomic(path, self.text())
        return path


class DamagedManifest(CorruptCapture):
    """``manifest.json`` is ours but cannot be read (not JSON, fields of the wrong type). The
    loaders go on without it from the captures that read fine."""

    def __init__(self, path: Path, why: str) -> None:
        super().__init__(f"{path} is damaged ({why})")
        self.why = why


def read_manifest(directory: Path) -> Manifest | None:
    """The manifest of ``directory`` (None: it has none). Raises ``NotACapture`` for another
    tool's JSON, ``UnsupportedVersion``, and ``DamagedManifest``."""
    path = directory / MANIFEST
    if not path.is_file():
        return None
    try:
        raw = bounded_json.load_file(path, limit=MANIFEST_MAX)
    except OSError as err:
        raise DamagedManifest(path, f"unreadable: {err.strerror}") from None
    except bounded_json.JsonDamaged as err:
        raise DamagedManifest(path, str(err)) from None
    if not isinstance(raw, dict) or raw.get("format") != MANIFEST_FORMAT:
        raise NotACapture(f"{path} is not an nccl-doctor manifest (no \"format\": \"{MANIFEST_FORMAT}\")")
    version = raw.get("format_version")
    if version not in fmt.READABLE_VERSIONS:
        raise UnsupportedVersion(
            f"{path} is capture format version {version}, this nccl-doctor reads versions "
            f"{fmt.readable_versions()}: replay it with the nccl-doctor release that recorded it"
        )
    try:
        redacted = _typed(raw, "redacted", bool, True)
        command = _strings(raw, "command")
        return Manifest(
            # (older manifests stored it verbatim: masked on reading, for the report)
            command=tuple(redact.argv(command) if redacted else command),
            started_at=float(_typed(raw, "started_at", _NUMBER, 0.0)),
            run_id=_typed(raw, "run_id", str, ""),
            tool_version=_typed(raw, "tool_version", str, ""),
            ended_at=_typed(raw, "ended_at", _NUMBER, None),
            exit_status=_typed(raw, "exit_status", int, None),
            world_size=_typed(raw, "world_size", int, None),
            hosts=tuple(_strings(raw, "hosts")), captures=tuple(_strings(raw, "captures")),
            extra=dict(_typed(raw, "extra", dict, {})), redacted=redacted,
        )
    except (TypeError, ValueError) as err:
        raise DamagedManifest(path, str(err)) from None


_NUMBER = (int, float)


def _typed(raw: dict[str, Any], name: str, kind: Any, default: Any) -> Any:
    """``raw[name]`` if it is a ``kind`` (or None where ``default`` is: optional), ``default``
    when absent; a wrong type raises TypeError. (bool is an int to Python, never to us.)"""
    if name not in raw or (raw[name] is None and default is None):
        return default
    value = raw[name]
    if not isinstance(value, kind) or (isinstance(value, bool) and kind is not bool):
        raise TypeError(f"its {name!r} is {type(value).__name__} {json.dumps(value)[:40]}")
    return value


def _strings(raw: dict[str, Any], name: str) -> list[str]:
    value = _typed(raw, name, list, [])
    if not all(isinstance(v, str) for v in value):
        raise TypeError(f"its {name!r} holds non-strings")
    return value
