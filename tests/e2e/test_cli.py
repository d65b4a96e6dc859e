"""The `nccl-doctor` command as a user runs it: exit statuses, output, bad input."""

from __future__ import annotations

import json
import os
import pickle
import signal
import struct
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from nccl_doctor.errors import ExitStatus

from .conftest import CLI, doctor


def one_error_line(proc: subprocess.CompletedProcess) -> str:
    lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1, proc.stderr
    assert "Traceback" not in proc.stderr
    assert lines[0].startswith("nccl-doctor: error: ")
    return lines[0]


def test_run_passes_output_through_and_keeps_the_exit_status(tmp_path):
    job = "import sys; print('out line'); print('err line', file=sys.stderr); sys.exit(3)"
    proc = doctor("run", "--out", str(tmp_path / "o"), "--", sys.executable, "-c", job)
    assert proc.returncode == 3
    assert proc.stdout == "out line\n"  # the doctor writes nothing to the job's stdout
    assert proc.stderr.startswith("err line\n")
    manifest = json.loads((tmp_path / "o" / "manifest.json").read_text())
    assert manifest["exit_status"] == 3 and manifest["format_version"] == 2
    report = json.loads((tmp_path / "o" / "report.json").read_text())
    assert report["verdict"] == "crash" and report["exit_status"] == 3
    assert any("no rank joined" in n for n in report["notes"])


def test_run_without_a_command_is_a_usage_error(tmp_path):
    proc = doctor("run", "--out", str(tmp_path / "o"))
    assert proc.returncode == ExitStatus.USAGE
    assert "no command to run" in one_error_line(proc)


def test_run_refuses_a_non_empty_out_dir_without_force(tmp_path):
    (tmp_path / "o").mkdir()
    (tmp_path / "o" / "keep.txt").write_text("user data")
    proc = doctor("run", "--out", str(tmp_path / "o"), "--", sys.executable, "-c", "pass")
    assert proc.returncode == ExitStatus.OUTPUT_EXISTS
    assert "--force" in one_error_line(proc)
    proc = doctor("run", "--force", "--out", str(tmp_path / "o"), "--", sys.executable, "-c", "pass")
    assert proc.returncode == 0
    assert (tmp_path / "o" / "keep.txt").read_text() == "user data"  # never the user's files


def test_run_of_a_missing_program(tmp_path):
    proc = doctor("run", "--out", str(tmp_path / "o"), "--", "no-such-program-xyz")
    assert proc.returncode == ExitStatus.LAUNCH_FAILED
    assert "command not found" in one_error_line(proc)


def test_a_failed_launch_leaves_no_empty_run_directory(tmp_path):
    """Without --out the run makes nccl-doctor-out/run-...: a launch that fails removes it,
    and nccl-doctor-out/ too where the run made that; a directory holding anything stays."""
    proc = doctor("run", "--", "no-such-program-xyz", cwd=tmp_path)
    assert proc.returncode == ExitStatus.LAUNCH_FAILED, proc.stderr
    assert list(tmp_path.iterdir()) == []
    kept = tmp_path / "nccl-doctor-out" / "earlier-run"
    kept.mkdir(parents=True)
    proc = doctor("run", "--", "no-such-program-xyz", cwd=tmp_path)
    assert proc.returncode == ExitStatus.LAUNCH_FAILED, proc.stderr
    assert list((tmp_path / "nccl-doctor-out").iterdir()) == [kept]


@pytest.mark.parametrize("setup,status,words", [
    ("missing", ExitStatus.NOT_FOUND, "does not exist"),
    ("empty", ExitStatus.NOT_FOUND, "is empty"),
    ("foreign", ExitStatus.NOT_A_CAPTURE, "not an nccl-doctor capture"),
    ("version", ExitStatus.UNSUPPORTED_VERSION, "format version 99"),
    ("corrupt", ExitStatus.CORRUPT, "cannot be read"),
])
def test_replay_bad_input(tmp_path, capture_copy, setup, status, words):
    target = tmp_path / "x"
    if setup == "empty":
        target.mkdir()
    elif setup == "foreign":
        target.mkdir()
        (target / "notes.txt").write_text("hello")
    elif setup == "version":
        target = capture_copy
        for f in target.glob("*.ndcap"):
            with f.open("r+b") as fh:
                fh.seek(8)
                fh.write(struct.pack("<I", 99))
        manifest = json.loads((target / "manifest.json").read_text())
        manifest["format_version"] = 99
        (target / "manifest.json").write_text(json.dumps(manifest))
    elif setup == "corrupt":
        target = capture_copy
        for f in target.glob("*.ndcap"):
            f.write_bytes(f.read_bytes()[:200])  # cut inside the header of every rank
    proc = doctor("replay", str(target))
    assert proc.returncode == status, proc.stderr
    assert words in one_error_line(proc)


def test_replay_of_a_partly_torn_capture_says_which_rank(capture_copy):
    files = sorted(capture_copy.glob("*.ndcap"))
    data = bytearray(files[1].read_bytes())
    ring = struct.unpack_from("<Q", data, 24)[0]  # ring offset, from the header
    data[ring + 30] ^= 0xFF  # one byte inside rank 1's first event record
    files[1].write_bytes(bytes(data))
    proc = doctor("replay", "--format", "json", str(capture_copy))
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout)
    # its first record, of a rank that exited by itself: no kill cut it - the file is damaged
    assert [n for n in report["notes"] if files[1].name in n] == [
        f"rank 1's capture {files[1].name} is damaged (1 torn record(s)): what it still held was "
        "used, what it lost is not evidence against rank 1; the diagnosis is partial"]
    assert report["partial"] == "the capture of rank 1 is damaged"
    assert report["ranks"][1]["capture"]["complete"] is False
    assert report["ranks"][0]["capture"]["complete"] is True


def test_replay_writes_json_and_refuses_to_overwrite(clean_capture, tmp_path):
    out = tmp_path / "r.json"
    proc = doctor("replay", str(clean_capture), "-o", str(out))
    assert proc.returncode == 0, proc.stderr
    assert f"Wrote {out}" in proc.stderr
    report = json.loads(out.read_text())
    assert report["schema_version"] == 1 and report["verdict"] == "ok"
    assert [r["rank"] for r in report["ranks"]] == [0, 1]
    again = doctor("replay", str(clean_capture), "-o", str(out))
    assert again.returncode == ExitStatus.OUTPUT_EXISTS
    console = doctor("replay", str(clean_capture))
    assert console.returncode == 0 and "OK" in console.stdout


def test_ctrl_c_reaches_the_job_and_leaves_no_process(tmp_path):
    # 'ready' is printed inside the try: the SIGINT may arrive as soon as its line is written
    job = ("import time, sys\ntry:\n    print('ready', flush=True)\n    time.sleep(60)\n"
           "except KeyboardInterrupt:\n    print('job got SIGINT', flush=True); sys.exit(5)\n")
    proc = subprocess.Popen([*CLI, "run", "--quiet", "--out", str(tmp_path / "o"), "--",
                             sys.executable, "-c", job], stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline() == "ready\n"
    children = psutil.Process(proc.pid).children(recursive=True)
    assert children
    os.kill(proc.pid, signal.SIGINT)  # what a terminal's Ctrl-C sends to the foreground doctor
    out, _ = proc.communicate(timeout=60)
    assert "job got SIGINT" in out
    assert proc.returncode == 5  # the job's own status
    time.sleep(0.2)
    assert not [c for c in children if c.is_running() and c.status() != psutil.STATUS_ZOMBIE]


def test_padded_gather_example_is_diagnosed(tmp_path):
    out = tmp_path / "demo"
    proc = doctor("run", "--out", str(out), "--", sys.executable, "-m", "torch.distributed.run",
                  "--standalone", "--nproc-per-node=2", "-m", "nccl_doctor.examples.padded_gather")
    assert proc.returncode != 0
    assert "ROOT CAUSE collective_mismatch" in proc.stderr
    assert f"Wrote {out / 'report.json'}" in proc.stderr
    replay = doctor("replay", "--format", "json", str(out))
    assert json.loads(replay.stdout)["findings"][0]["seq"] == 7


def test_replay_reads_training_metrics_from_a_log(capture_copy, tmp_path):
    log = tmp_path / "train.log"
    log.write_text("".join(
        f"{{'loss': '0', 'reward': '1', 'reward_std': '0', 'epoch': '0.{i}'}}\n"
        for i in range(4)) + "some other line\n")
    proc = doctor("replay", "--format", "json", "--log", str(log), str(capture_copy))
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout)
    assert report["verdict"] == "suspect"
    (finding,) = report["findings"]
    assert finding["kind"] == "degenerate_signal"
    assert finding["evidence"]["criteria"] == ["reward_std", "loss"]
    strict = doctor("replay", "--fail-on", "suspect", "--log", str(log), str(capture_copy))
    assert strict.returncode == ExitStatus.VERDICT_FAILED
    clean = doctor("replay", "--fail-on", "suspect", str(capture_copy))
    assert clean.returncode == 0


def test_replay_with_a_missing_log_is_one_line(capture_copy, tmp_path):
    proc = doctor("replay", "--log", str(tmp_path / "nope.log"), str(capture_copy))
    assert proc.returncode == ExitStatus.NOT_FOUND
    assert "--log" in one_error_line(proc)


FR_FIXTURES = Path(__file__).parent.parent / "fixtures" / "fr_dumps"


class _Payload:
    def __init__(self, target: str) -> None:
        self.target = target

    def __reduce__(self):
        return (os.system, (f"touch {self.target}",))


@pytest.mark.parametrize("setup,status,words", [
    ("malicious", ExitStatus.REFUSED, "asks for posix.system: refused"),
    ("truncated", ExitStatus.CORRUPT, "truncated or damaged pickle"),
    ("future", ExitStatus.UNSUPPORTED_VERSION, "Flight Recorder format 7.0"),
    ("wrong_type", ExitStatus.CORRUPT, "\"entries\" must be a list"),
])
def test_replay_of_bad_flight_recorder_dumps_is_one_line(tmp_path, setup, status, words):
    dumps = tmp_path / "dumps"
    dumps.mkdir()
    good = (FR_FIXTURES / "h100_nccl_skip_broadcast" / "rank_0").read_bytes()
    if setup == "malicious":
        content = pickle.dumps({"version": "2.10", "entries": [],
                                "x": _Payload(str(tmp_path / "pwned"))})
    elif setup == "truncated":
        content = good[:300]
    elif setup == "future":
        content = pickle.dumps({"version": "7.0", "entries": []})
    else:
        content = json.dumps({"version": "2.10", "entries": {"0": "all_reduce"}}).encode()
    (dumps / "rank_0").write_bytes(content)
    proc = doctor("replay", str(dumps))
    assert proc.returncode == status, proc.stderr
    assert words in one_error_line(proc)
    assert not (tmp_path / "pwned").exists()


def test_replay_of_flight_recorder_dumps_names_the_culprit(tmp_path):
    proc = doctor("replay", "--format", "json", str(FR_FIXTURES / "h100_nccl_shape_mismatch"))
    assert proc.returncode == 0, proc.stderr
    root = json.loads(proc.stdout)["findings"][0]
    assert root["root_cause"] and root["kind"] == "collective_mismatch" and root["ranks"] == [1]
    assert root["callsite"].endswith("nccl_shape_mismatch.py:15")
    missing = doctor("replay", str(FR_FIXTURES / "h100_nccl_shape_mismatch"), "--fr",
                     str(tmp_path / "nope"))
    assert missing.returncode == ExitStatus.NOT_FOUND and "does not exist" in one_error_line(
        missing)


@pytest.mark.parametrize("flags, words", [
    (["--coordinator", "nohost"], "--coordinator 'nohost' is not HOST:PORT"),
    (["--coordinator", "h:99999"], "the port must be 1-65535"),
    (["--node-rank", "-1"], "give a number >= 0"),
    (["--nnodes", "two"], "'two' is not a whole number"),
])
def test_run_with_bad_multi_node_options_is_one_line(tmp_path, flags, words):
    proc = doctor("run", "--out", str(tmp_path / "o"), *flags, "--", sys.executable, "-c", "pass")
    assert proc.returncode == ExitStatus.USAGE
    assert words in one_error_line(proc)
    assert not (tmp_path / "o").exists()  # nothing was started


def test_a_job_with_no_recorded_rank_is_not_ok(tmp_path):
    """A program that never joins a process group under the recorder (here: none at all; in
    life, ranks started by a Ray cluster started beforehand) reads not_recorded, never ok, and
    --fail-on suspect fails on it."""
    proc = doctor("run", "--fail-on", "suspect", "--out", str(tmp_path / "o"), "--",
                  sys.executable, "-c", "print('no torch.distributed here')")
    assert proc.returncode == 123, proc.stderr[-2000:]
    assert "NOT_RECORDED" in proc.stderr and "no rank joined a process group" in proc.stderr
    report = json.loads((tmp_path / "o" / "report.json").read_text())
    assert report["verdict"] == "not_recorded" and report["ranks"] == []
