"""Replay of a capture directory tells the live run's story: the same verdict and root cause,
the ranks nccl-doctor stopped named so, and a backend timeout after a called hang kept as a
consequence (issue 14)."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from dataclasses import replace
from pathlib import Path

import pytest

from nccl_doctor.analysis import analyze
from nccl_doctor.analysis.calls.loaded import load
from nccl_doctor.errors import ExitStatus
from nccl_doctor.supervisor.policy import HangPolicy, OnHang
from nccl_doctor.supervisor.supervisor import Supervisor

pytestmark = pytest.mark.integration

JOBS = Path(__file__).parent / "jobs"


def _root(report: dict) -> dict:
    (root,) = [f for f in report["findings"] if f["root_cause"]]
    return {k: root[k] for k in ("kind", "ranks", "group", "seq", "op", "callsite")}


def _replay(out: Path, *extra: str) -> dict:
    proc = subprocess.run(
        [sys.executable, "-m", "nccl_doctor", "replay", str(out), "--format", "json", *extra],
        capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


@pytest.mark.parametrize("name", ["ddp_uneven", "skip_broadcast"])
def test_replay_of_a_stopped_hang_equals_the_live_diagnosis(stopped_hang, name):
    sup = stopped_hang(name).sup
    live = json.loads((sup.out_dir / "report.json").read_text())
    assert live["verdict"] == "hang" and live["exit_status"] == ExitStatus.HANG_STOPPED, live
    replay = _replay(sup.out_dir)
    assert replay["verdict"] == "hang", replay["findings"]
    assert _root(replay) == _root(live)
    assert replay["exit_status"] == live["exit_status"]
    # the ranks the doctor stopped are named so, never "SIGKILL, the OOM killer"
    for r in replay["ranks"]:
        assert r["state"] == "stopped" and "stopped by nccl-doctor" in r["exit_detail"], r
    assert not any(f["kind"] == "rank_exited" for f in replay["findings"])
    assert not any("OOM" in json.dumps(f) for f in replay["findings"])
    # what the watchdog did is in the record, and in the replayed report
    assert replay["watchdog"]["situation"] == live["watchdog"]["situation"]
    assert replay["watchdog"]["root_from_captures"] is True  # a desync: the captures say it too
    assert any("(exit request)" in n for n in replay["notes"]), replay["notes"]
    assert replay["stack_classes"], "the stacks taken at the hang were not kept"


def test_ddp_flight_recorder_pulls_are_kept_and_merge_with_fr(tmp_path, stopped_hang):
    """The C++ all_reduce is seen only through Flight Recorder: without the kept pulls replay
    cannot name it; given back through --fr, the same diagnosis."""
    out = tmp_path / "out"  # the shared run's directory is left as it was
    shutil.copytree(stopped_hang("ddp_uneven").sup.out_dir, out)
    live = json.loads((out / "report.json").read_text())
    kept = out / "flight_recorder"
    assert sorted(p.name for p in kept.iterdir()) == ["rank_0.json", "rank_1.json"]
    moved = tmp_path / "fr"
    shutil.move(str(kept), moved)
    # the analysis itself (the watchdog's record set aside): blind to the C++ all_reduce alone...
    alone = analyze(replace(load(out), watch=None))
    assert not any(s["op"] == "all_reduce" for f in alone.findings
                   for s in f.evidence.get("sides", [])), alone.findings
    # ...and with the job's Flight Recorder dumps merged (--fr), it names it
    merged = analyze(replace(load(out, fr=moved), watch=None))
    root = merged.root_cause
    assert root is not None and root.kind.value == "collective_mismatch", merged.findings
    assert {s["op"] for s in root.evidence["sides"]} == {"all_reduce", "barrier"}
    assert (root.group, root.seq) == (_root(live)["group"], _root(live)["seq"])
    # and through the CLI, with the record: the live story
    assert _root(_replay(out, "--fr", str(moved))) == _root(live)


@pytest.mark.parametrize("on_timeout", ["raise", "retry"])
def test_a_backend_timeout_after_a_reported_hang_is_not_progress(tmp_path, launch, on_timeout):
    """--on-hang report, gloo's own timeout short: the stuck calls raise a while after the hang
    is called; the ranks then end ("raise": seen post mortem) or first make a new call ("retry",
    as NCCL ranks do after the communicator is aborted: seen live). The hang stands, and the
    report says what gloo did."""
    messages: list[str] = []
    sup = Supervisor(launch(2, str(JOBS / "skip_broadcast.py")), tmp_path / "out",
                     environ=dict(os.environ, SKIPPER="1", GLOO_TIMEOUT_S="8",
                                  ON_TIMEOUT=on_timeout),
                     policy=HangPolicy(on_hang=OnHang.REPORT), announce=messages.append)
    box: dict = {}
    thread = threading.Thread(target=lambda: box.setdefault("result", sup.run()))
    thread.start()
    thread.join(120)
    if thread.is_alive() and sup.job is not None:
        sup.job.signal(signal.SIGKILL)
        thread.join(30)
    result = box["result"]
    assert any(m.startswith("HANG") for m in messages), messages
    assert not any("retracted" in m for m in messages), messages
    assert any("the hang stands" in m for m in messages), messages
    live = json.loads((sup.out_dir / "report.json").read_text())
    assert result.diagnosis.verdict.value == "hang" and live["verdict"] == "hang", live["notes"]
    assert live["watchdog"].get("aftermath"), live["watchdog"]
    assert not live["watchdog"].get("retracted")
    replay = _replay(sup.out_dir)
    assert replay["verdict"] == "hang" and _root(replay) == _root(live)
    assert any("not progress" in n for n in replay["notes"]), replay["notes"]
    # no report policy stop: the ranks ended by themselves, and say how
    assert all(r["state"] != "stopped" for r in replay["ranks"])
    deadline = time.monotonic() + 5
    while sup.job is not None and sup.job.group_alive() and time.monotonic() < deadline:
        time.sleep(0.2)
