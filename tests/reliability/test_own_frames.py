"""Noise around the diagnosis: a rank's stack ends at the user's line, never in nccl-doctor's own
wrapper around it; a run leaves no empty faulthandler file, and a rank that did fault keeps its
file, which the report reads."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from nccl_doctor.capture import format as fmt
from nccl_doctor.capture.fault_files import drop_empty_fault_files
from nccl_doctor.errors import ExitStatus
from nccl_doctor.stacks.rank_stack import parse_stack_json, stack_from_json
from nccl_doctor.supervisor.pyspy import PYSPY_ENV

from .conftest import JOBS, doctor, os, spawn, torchrun

pytestmark = pytest.mark.integration

OWN_JOBS = Path(__file__).parent / "jobs"
WAIT_LINE = 17  # wait_hang.py: rank 0's work.wait()
FAULT_LINE = 11  # segfault.py: rank 1's NULL read


def ours(frame: str) -> bool:
    return f"nccl_doctor{os.sep}" in frame


@pytest.mark.parametrize("source", ["py-spy", "agent"])
def test_a_stack_waiting_in_work_wait_ends_at_the_user_s_line(tmp_path, source):
    out = tmp_path / "out"
    environ = {**os.environ, **({PYSPY_ENV: "none"} if source == "agent" else {})}
    proc = doctor("run", "--out", str(out), "--stuck-after", "3", "--",
                  *torchrun(2, OWN_JOBS / "wait_hang.py"), env=environ)
    assert proc.returncode == ExitStatus.HANG_STOPPED, proc.stderr[-3000:]
    where = f"wait_hang.py:{WAIT_LINE} step"
    for report in (json.loads((out / "report.json").read_text()),
                   json.loads(doctor("replay", "--format", "json", str(out)).stdout)):
        waiting = next(c for c in report["stack_classes"] if 0 in c["ranks"])
        assert waiting["sources"] == [source]
        assert waiting["frames"][-1].endswith(where), waiting["frames"]
        every = [f for c in report["stack_classes"] for f in c["frames"]]
        assert not [f for f in every if ours(f)], every
        rank0 = next(r for r in report["ranks"] if r["rank"] == 0)
        assert f"wait_hang.py:{WAIT_LINE} in step" in rank0["stack_summary"]
    kept = json.loads((out / "stacks.json").read_text())["ranks"]["0"]
    main = next(t for t in kept["threads"] if t["is_main"])
    assert main["frames"][0]["line"] == WAIT_LINE  # innermost first: the user's line
    assert not [f for f in main["frames"] if ours(f["path"])]
    assert f"wait_hang.py:{WAIT_LINE} step" in proc.stderr  # the console's stacks line


def test_a_healthy_run_leaves_no_fault_file(tmp_path):
    out = tmp_path / "out"
    proc = doctor("run", "--out", str(out), "--", *spawn(2, JOBS / "clean.py"))
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert len(list(out.glob(f"*{fmt.CAPTURE_SUFFIX}"))) == 2
    assert list(out.glob(f"*{fmt.FAULT_SUFFIX}")) == []


def test_a_rank_that_segfaults_keeps_its_fault_file_and_the_report_reads_it(tmp_path):
    out = tmp_path / "out"
    proc = doctor("run", "--out", str(out), "--", *torchrun(2, OWN_JOBS / "segfault.py"))
    assert proc.returncode != 0, proc.stderr[-3000:]
    faults = list(out.glob(f"*{fmt.FAULT_SUFFIX}"))
    assert [f for f in faults if f.stat().st_size == 0] == []  # rank 0 was stopped: none of its
    (kept,) = [f for f in faults if f.name.startswith("rank00001.")]
    text = kept.read_text()
    assert "Segmentation fault" in text and f'segfault.py", line {FAULT_LINE} in crash' in text
    for report in (json.loads((out / "report.json").read_text()),
                   json.loads(doctor("replay", "--format", "json", str(out)).stdout)):
        rank1 = next(r for r in report["ranks"] if r["rank"] == 1)
        assert (rank1["state"], rank1["signal"]) == ("signal", "SIGSEGV")  # known from the file
    assert "killed by SIGSEGV" in proc.stderr


# --- the pieces alone ---------------------------------------------------------------------------

def _frame(path: str, line: int, name: str) -> dict:
    return {"name": name, "filename": path, "line": line}


def test_stacks_drop_the_doctor_s_frames_but_keep_the_programs_it_ships():
    site = f"{os.sep}venv{os.sep}site-packages{os.sep}nccl_doctor{os.sep}"
    frames = [
        _frame(f"{site}rank{os.sep}recorder{os.sep}wrappers.py", 231, "patch_wait.<locals>.wait"),
        _frame(f"{site}trainers{os.sep}grpo.py", 40, "step"),
        _frame(f"{site}reproducers{os.sep}padded.py", 12, "gather"),
        _frame(f"{site}examples{os.sep}padded_gather.py", 9, "main"),
        _frame(f"{site}capture{os.sep}writer.py", 80, "CaptureWriter.begin"),
        _frame(f"{os.sep}job{os.sep}train.py", 5, "<module>"),
    ]
    stack = parse_stack_json([{"thread_id": 1, "is_main": True, "frames": frames}], rank=0,
                             pid=1, source="py-spy")
    kept = [f.function for f in stack.main.frames]
    assert kept == ["step", "gather", "main", "<module>"]
    again = stack_from_json({"threads": [{"thread_id": 1, "is_main": True, "frames": [
        {"path": f["filename"], "line": f["line"], "function": f["name"]} for f in frames]}]}, 0)
    assert [f.function for f in again.main.frames] == kept  # a stacks.json kept before the fix


def test_drop_empty_fault_files_removes_only_empty_ones_beside_a_capture(tmp_path):
    def touch(name: str, text: str = "") -> Path:
        (tmp_path / name).write_text(text)
        return tmp_path / name

    touch("rank00000.h.1.ndcap", "x")
    empty = touch("rank00000.h.1.fault")
    touch("rank00001.h.2.ndcap", "x")
    full = touch("rank00001.h.2.fault", "Fatal Python error: Segmentation fault\n")
    foreign = touch("notes.fault")  # not beside a capture: not ours
    (tmp_path / "rank00002.h.3.ndcap").write_text("x")
    (tmp_path / "rank00002.h.3.fault").symlink_to(foreign)
    assert drop_empty_fault_files(tmp_path) == [empty]
    assert not empty.exists() and full.exists() and foreign.exists()
    assert (tmp_path / "rank00002.h.3.fault").is_symlink()
    assert drop_empty_fault_files(tmp_path / "missing") == []
