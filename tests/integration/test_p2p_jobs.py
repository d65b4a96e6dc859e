"""Point-to-point is its own model (issue 50): real gloo pipelines - torch's own
torch.distributed.pipelining (tests/integration/jobs/pipelining.py) and hand-written send/recv
and batch_isend_irecv ones (jobs/pipeline_p2p.py) - run under the doctor, live and replayed.
Healthy schedules read ok; a short channel, a shape or dtype that differs between a send and its
receive and a pair that both receive first are a p2p_mismatch root cause, and the stage split
(``if rank == 0: send ... else: recv ...``) is never named as a branch that skipped a call."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration

JOBS = Path(__file__).parent / "jobs"
PIPELINING = JOBS / "pipelining.py"
HAND_WRITTEN = JOBS / "pipeline_p2p.py"


def line_of(path: Path, text: str) -> int:
    return next(i for i, line in enumerate(path.read_text().splitlines(), 1) if text in line)


def reports(job) -> list[dict]:
    """The live report.json and the replay of the capture directory (a new analysis)."""
    proc = subprocess.run([sys.executable, "-m", "nccl_doctor", "replay", "--format", "json",
                           str(job.out)], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return [json.loads((job.out / "report.json").read_text()), json.loads(proc.stdout)]


def root_of(report: dict) -> dict:
    (root,) = [f for f in report["findings"] if f["root_cause"]]
    return root


def no_stage_split_blamed(report: dict) -> None:
    """No finding names a branch, or says a rank missed a collective: the ranks that send and
    the ranks that receive are the design."""
    for f in report["findings"]:
        assert f["branch"] is None, f
        assert f["kind"] not in ("missing_collective", "collective_mismatch"), f
        assert "skips the call" not in f["detail"], f["detail"]


HEALTHY = {
    "gpipe-2": (2, PIPELINING, {"SCHEDULE": "gpipe"}),
    "1f1b-2": (2, PIPELINING, {"SCHEDULE": "1f1b"}),
    "gpipe-4": (4, PIPELINING, {"SCHEDULE": "gpipe"}),
    "1f1b-4": (4, PIPELINING, {"SCHEDULE": "1f1b"}),
    "send-recv": (2, HAND_WRITTEN, {"SCENARIO": "healthy"}),
    "batch": (2, HAND_WRITTEN, {"SCENARIO": "batch"}),
    "async": (2, HAND_WRITTEN, {"SCENARIO": "async"}),
}


@pytest.mark.parametrize("case", sorted(HEALTHY))
def test_a_healthy_pipeline_reads_ok(run_job, case):
    nproc, script, env = HEALTHY[case]
    job = run_job(nproc, str(script), env=env)
    assert job.exit_status == 0
    for report in reports(job):
        assert report["verdict"] == "ok", report["findings"]
        assert not [f for f in report["findings"] if f["severity"] != "info"], report["findings"]


@pytest.mark.parametrize("scenario", ["short", "batch_short"])
def test_a_short_channel_is_the_root_cause_not_the_stage_split(run_job, scenario):
    """The first stage cuts its microbatches from a short last batch: it sends 3 in that step,
    the second stage waits for a 4th. Called within the watchdog's seconds, as a deadlock."""
    job = run_job(2, str(HAND_WRITTEN), env={"SCENARIO": scenario})
    for report in reports(job):
        assert report["verdict"] == "hang", report["findings"]
        root = root_of(report)
        assert root["kind"] == "p2p_mismatch", root
        ev = root["evidence"]
        assert (ev["aspect"], ev["src"], ev["dst"]) == ("count", 0, 1), ev
        assert ev["step"]["sent"] == 3 and ev["step"]["received"] == 4, ev
        assert (ev["sent"], ev["received"]) == (11, 12), ev
        assert ev["waiting"] == {"1": "waits"}, ev
        assert "rank 0 sent 3 messages since barrier #2" in root["title"], root["title"]
        assert "rank 1 waits for a 4th" in root["title"], root["title"]
        assert "rank 0 is blocked in barrier #3" in root["detail"], root["detail"]
        no_stage_split_blamed(report)
        if scenario == "short":  # each stage's own loop, with the calls it made
            loops = {x["rank"]: (x["line"], x["calls"]) for x in ev["loops"]}
            assert loops == {0: (line_of(HAND_WRITTEN, "for chunk in chunks:"), 3),
                             1: (line_of(HAND_WRITTEN, "for buf in bufs:"), 4)}, ev["loops"]
            assert "`for chunk in chunks:`" in root["detail"], root["detail"]
    live = json.loads((job.out / "watchdog.json").read_text())
    assert "deadlock" in json.dumps(live), live


def test_both_ranks_receiving_first_is_a_p2p_deadlock(run_job):
    job = run_job(2, str(HAND_WRITTEN), env={"SCENARIO": "swapped"})
    for report in reports(job):
        assert report["verdict"] == "hang", report["findings"]
        root = root_of(report)
        assert root["kind"] == "p2p_mismatch" and root["ranks"] == [0, 1], root
        assert root["evidence"]["aspect"] == "deadlock", root["evidence"]
        assert sorted(root["evidence"]["cycle"]) == [0, 1], root["evidence"]
        assert root["callsite"].endswith(f"pipeline_p2p.py:{line_of(HAND_WRITTEN, 'dist.recv(t')}")
        assert "neither sent" in root["title"], root["title"]
        no_stage_split_blamed(report)


def test_a_receive_of_another_dtype_is_named_though_the_job_ends_well(run_job):
    """gloo fills a float64 buffer from a float32 send without a word: the job exits 0."""
    job = run_job(2, str(HAND_WRITTEN), env={"SCENARIO": "dtype"})
    assert job.exit_status == 0
    for report in reports(job):
        assert report["verdict"] == "suspect", report["findings"]
        (f,) = [f for f in report["findings"] if f["kind"] == "p2p_mismatch"]
        assert f["severity"] == "warning", f
        ev = f["evidence"]
        assert (ev["aspect"], ev["message"]) == ("dtype", 1), ev
        assert (ev["sent_input"], ev["received_input"]) == ("float32[2,4]", "float64[2,4]"), ev


def test_pipelining_stages_with_different_microbatches_are_a_short_channel(run_job):
    job = run_job(2, str(PIPELINING), env={"SCHEDULE": "gpipe", "SCENARIO": "microbatches"})
    for report in reports(job):
        assert report["verdict"] == "hang", report["findings"]
        root = root_of(report)
        ev = root["evidence"]
        assert root["kind"] == "p2p_mismatch" and ev["aspect"] == "count", root
        # stage 0 sends one activation more than stage 1 receives, and waits in it
        assert (ev["src"], ev["dst"]) == (0, 1) and ev["sent"] == ev["received"] + 1, ev
        assert ev["waiting"] == {"0": "waits"}, ev
        assert "n_microbatches" in root["hint"]
        no_stage_split_blamed(report)


def test_pipelining_stage_of_another_input_shape_is_named(run_job):
    job = run_job(2, str(PIPELINING), env={"SCHEDULE": "1f1b", "SCENARIO": "shape"})
    for report in reports(job):
        assert report["verdict"] == "crash", report["findings"]
        root = root_of(report)
        ev = root["evidence"]
        assert root["kind"] == "p2p_mismatch" and ev["aspect"] == "shape", root
        assert (ev["src"], ev["dst"]) == (0, 1), ev
        assert (ev["sent_input"], ev["received_input"]) == ("float32[2,6]", "float32[2,8]"), ev
        assert root["severity"] == "error"
        assert not [f for f in report["findings"] if f["branch"] is not None]
