"""A damaged manifest.json does not block the captures beside it: replay warns and goes on from
the .ndcap files that read fine, as if there were no manifest. Another tool's manifest, a capture
format this release cannot read, and a damaged manifest with no readable capture stay errors."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from nccl_doctor.capture.manifest import MANIFEST
from nccl_doctor.errors import ExitStatus

from .conftest import JOBS, doctor, spawn

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def healthy(tmp_path_factory) -> tuple[Path, dict]:
    """A real 2-rank capture of a healthy job, and its replay's report."""
    out = tmp_path_factory.mktemp("healthy") / "cap"
    proc = doctor("run", "--quiet", "--out", str(out), "--", *spawn(2, JOBS / "clean.py"))
    assert proc.returncode == 0, proc.stderr[-3000:]
    replay = doctor("replay", "--format", "json", str(out))
    assert replay.returncode == 0, replay.stderr[-3000:]
    return out, json.loads(replay.stdout)


@pytest.fixture
def capture(healthy, tmp_path: Path) -> Path:
    dst = tmp_path / "copy"
    shutil.copytree(healthy[0], dst)
    return dst


def _truncate(text: bytes) -> bytes:
    return text[: len(text) // 2]


def _garble(text: bytes) -> bytes:
    return text[:40] + b"\x00\xff\x13garbage}{" + text[52:]


def _retype(field: str, value):
    def change(text: bytes) -> bytes:
        raw = json.loads(text)
        raw[field] = value
        return json.dumps(raw).encode()
    return change


DAMAGES = {
    "truncated": _truncate,
    "garbled": _garble,
    "empty": lambda text: b"",
    "zero-filled": lambda text: bytes(len(text)),  # a crash on some filesystems leaves this
    "world_size a string": _retype("world_size", "two"),
    "command a string": _retype("command", "torchrun t.py"),
    "ended_at a list": _retype("ended_at", [1, 2]),
    "extra a list": _retype("extra", ["node"]),
    "exit_status a bool": _retype("exit_status", True),
}


@pytest.mark.parametrize("damage", list(DAMAGES))
def test_a_damaged_manifest_is_a_note_and_the_captures_are_replayed(healthy, capture: Path,
                                                                     damage: str) -> None:
    manifest = capture / MANIFEST
    manifest.write_bytes(DAMAGES[damage](manifest.read_bytes()))
    proc = doctor("replay", str(capture))
    assert proc.returncode == ExitStatus.OK, proc.stderr[-3000:]
    said = " ".join((proc.stdout + proc.stderr).split())  # (the console wraps long notes)
    assert "Traceback" not in said and "internal error" not in said
    assert "manifest.json is damaged" in said
    assert "reconstructed from the captures" in said
    # the same diagnosis as the intact directory's: the verdict, every rank, no finding
    report = json.loads(doctor("replay", "--format", "json", str(capture)).stdout)
    expected = healthy[1]
    assert report["verdict"] == expected["verdict"] == "ok"
    assert [r["rank"] for r in report["ranks"]] == [r["rank"] for r in expected["ranks"]]
    assert [r["state"] for r in report["ranks"]] == [r["state"] for r in expected["ranks"]]
    assert report["findings"] == expected["findings"] == []
    (note,) = [n for n in report["notes"] if "manifest.json is damaged" in n]
    assert "command, exit status and end time are unknown" in note
    assert report["command"] == [] and report["exit_status"] is None


def test_a_damaged_manifest_and_no_capture_is_still_an_error(capture: Path) -> None:
    for path in capture.glob("*.ndcap"):
        path.unlink()
    (capture / MANIFEST).write_bytes(b'{"format": "nccl-doctor-capture", "comm')
    proc = doctor("replay", str(capture))
    assert proc.returncode == ExitStatus.CORRUPT
    (line,) = proc.stderr.strip().splitlines()
    assert "manifest.json is damaged" in line and "Traceback" not in proc.stderr


def test_another_tools_manifest_is_still_not_a_capture(capture: Path) -> None:
    (capture / MANIFEST).write_text(json.dumps({"format": "some-other-tool", "files": []}))
    proc = doctor("replay", str(capture))
    assert proc.returncode == ExitStatus.NOT_A_CAPTURE, proc.stderr
    assert "not an nccl-doctor manifest" in proc.stderr


def test_a_future_format_version_is_still_unsupported(capture: Path) -> None:
    raw = json.loads((capture / MANIFEST).read_text())
    raw["format_version"] = 99
    (capture / MANIFEST).write_text(json.dumps(raw))
    proc = doctor("replay", str(capture))
    assert proc.returncode == ExitStatus.UNSUPPORTED_VERSION, proc.stderr
    assert "99" in proc.stderr
