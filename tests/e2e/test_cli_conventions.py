"""Conventions other tools rely on: a closed pipe ends a command quietly with a documented
status (``| head``), and ``--format`` agrees with the output file's extension. Real commands,
real pipes whose reader has gone, a real hung job."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from nccl_doctor.errors import ExitStatus

from .conftest import CLI, JOBS, doctor


def closed_stdout(*args: str, stdout_closed: bool = True, **kwargs) -> subprocess.CompletedProcess:
    """``nccl-doctor ARGS`` writing to a pipe whose reader has already gone (stdout, or else
    stderr): every write there fails with EPIPE, as after ``| head`` has read its lines."""
    r, w = os.pipe()
    os.close(r)
    try:
        streams = ({"stdout": w, "stderr": subprocess.PIPE} if stdout_closed
                   else {"stdout": subprocess.PIPE, "stderr": w})
        return subprocess.run([*CLI, *args], text=True, timeout=240, **streams, **kwargs)
    finally:
        os.close(w)


@pytest.mark.parametrize("fmt", ["console", "json", "html"])
def test_replay_into_a_closed_pipe_exits_quietly(clean_capture, fmt):
    proc = closed_stdout("replay", "--format", fmt, str(clean_capture))
    assert proc.returncode == ExitStatus.CLOSED_PIPE == 141
    assert proc.stderr == ""  # no traceback, no "Exception ignored", no error line


def test_replay_piped_into_head_gives_the_first_line_and_exits_quietly(clean_capture):
    shell = subprocess.run(
        f"{' '.join(CLI)} replay {clean_capture} | head -1; echo \"status=${{PIPESTATUS[0]}}\"",
        shell=True, executable="/bin/bash", capture_output=True, text=True, timeout=240)
    first, status = shell.stdout.splitlines()
    assert first.startswith("nccl-doctor: OK - no problem found")
    # the report is longer than what head read, but it may fit in the pipe's buffer: either the
    # whole report was written (0) or the write failed and the exit was quiet (141)
    assert status in ("status=0", "status=141") and shell.stderr == ""


def test_an_error_with_a_closed_stdout_is_still_one_line(tmp_path):
    proc = closed_stdout("replay", str(tmp_path / "missing"))
    assert proc.returncode == ExitStatus.NOT_FOUND
    assert proc.stderr.count("\n") == 1 and proc.stderr.startswith("nccl-doctor: error: ")


def test_a_run_whose_terminal_went_away_goes_on_and_keeps_the_job_s_status(tmp_path):
    out = tmp_path / "o"
    proc = closed_stdout("run", "--out", str(out), "--", sys.executable, "-m",
                         "torch.distributed.run", "--standalone", "--nproc-per-node=3",
                         str(JOBS / "skip_broadcast.py"), stdout_closed=False,
                         env=dict(os.environ, SKIPPER="2"))
    # the live status, the hang's announcement and the report all met a closed stderr: the
    # watchdog still called the hang and stopped the job, and the files say it
    assert proc.returncode == ExitStatus.HANG_STOPPED
    report = json.loads((out / "report.json").read_text())
    assert report["verdict"] == "hang"
    assert (out / "report.html").is_file()


@pytest.mark.parametrize(("fmt", "name", "named"), [
    ("json", "r.html", "html"), ("html", "r.json", "json"), ("console", "r.htm", "html"),
    ("json", "r.txt", "console")])
def test_replay_refuses_a_format_the_file_name_contradicts(clean_capture, tmp_path, fmt, name,
                                                           named):
    proc = doctor("replay", "--format", fmt, "-o", str(tmp_path / name), str(clean_capture))
    assert proc.returncode == ExitStatus.USAGE
    assert proc.stderr.splitlines() == [
        f"nccl-doctor: error: -o {tmp_path / name}: its extension names the {named} format, "
        f"not --format {fmt}: end the file in "
        + {"json": ".json", "html": ".html or .htm", "console": ".txt or .log"}[fmt]
        + ", or leave --format out"]
    assert not (tmp_path / name).exists()


@pytest.mark.parametrize(("args", "name", "check"), [
    ([], "r.htm", lambda text: text.lstrip().lower().startswith("<!doctype html")),
    ([], "r.JSON", lambda text: json.loads(text)["verdict"] == "ok"),
    ([], "r.log", lambda text: text.startswith("nccl-doctor: OK")),
    (["--format", "json"], "r.out", lambda text: json.loads(text)["verdict"] == "ok"),
    (["--format", "html"], "r.html", lambda text: "<html" in text.lower())])
def test_replay_takes_the_format_from_the_extension_or_agrees_with_it(clean_capture, tmp_path,
                                                                     args, name, check):
    proc = doctor("replay", *args, "-o", str(tmp_path / name), str(clean_capture))
    assert proc.returncode == 0, proc.stderr
    assert check((tmp_path / name).read_text())


def test_export_refuses_a_format_the_file_name_contradicts(clean_capture, tmp_path):
    target = tmp_path / "calls.parquet"
    proc = doctor("export", str(clean_capture), "--format", "csv", "-o", str(target))
    assert proc.returncode == ExitStatus.USAGE
    assert proc.stderr.splitlines() == [
        f"nccl-doctor: error: -o {target}: its suffix names the parquet format, not --format "
        "csv: end the file in .csv, or leave --format out"]
    assert not target.exists()
    agreed = doctor("export", str(clean_capture), "--format", "csv", "-o",
                    str(tmp_path / "calls.txt"))
    assert agreed.returncode == 0, agreed.stderr
    assert (tmp_path / "calls.txt").read_text().splitlines()[0].startswith(("rank,", "\"rank\""))


def test_the_exit_status_table_lists_the_closed_pipe():
    table = (Path(__file__).parents[2] / "docs" / "exit-status.md").read_text()
    assert f"| {ExitStatus.CLOSED_PIPE} |" in table


def test_the_command_ends_at_once_but_only_after_its_threads_exit_handlers_and_streams(tmp_path):
    # the console script's entry skips Python's finalization (cli/main.py entry): what of it
    # matters must still happen - a thread that is not a daemon finishes, the exit handlers
    # run, buffered output is written - and the status is main's
    probe = f"""
import atexit, pathlib, sys, threading, time
from nccl_doctor.cli import main as cli
def main():
    def late():
        time.sleep(0.3)
        pathlib.Path({str(tmp_path / "thread")!r}).write_text("joined")
    threading.Thread(target=late).start()
    atexit.register(lambda: pathlib.Path({str(tmp_path / "atexit")!r}).write_text("ran"))
    sys.stdout.write("buffered, never flushed by main")
    return 5
cli.main = main
cli.entry()
"""
    proc = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                          timeout=60)
    assert proc.returncode == 5
    assert proc.stdout == "buffered, never flushed by main" and proc.stderr == ""
    assert (tmp_path / "thread").read_text() == "joined"
    assert (tmp_path / "atexit").read_text() == "ran"
