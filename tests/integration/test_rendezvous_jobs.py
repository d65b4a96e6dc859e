"""Ranks that never meet in init_process_group's rendezvous (issue 50): real 3-rank gloo jobs
(tests/integration/jobs/rendezvous.py). Before any capture exists, the ranks' joining records
(capture/joining.py) and stacks say who waits where: ranks told different rendezvous are
called at once, a rank that never comes after --stuck-after (shortened here); the job is
stopped and nothing of it is left; replay reaches the same root cause from the records."""

from __future__ import annotations

import json
import time
from pathlib import Path

import psutil
import pytest

from nccl_doctor.capture.joining import read_joinings
from nccl_doctor.supervisor.policy import HangPolicy
from tests.integration.test_branch_jobs import line_of, replayed, root_of

pytestmark = pytest.mark.integration

SCRIPT = Path(__file__).parent / "jobs" / "rendezvous.py"


def run(tmp_path, launch, watched, scenario, policy=None):
    sup, messages = watched(launch(3, str(SCRIPT)), tmp_path / "out", {"SCENARIO": scenario},
                            policy)
    result = sup.run()
    return sup, result, messages


def test_a_rank_told_another_port_is_called_at_once(tmp_path, launch, watched):
    sup, result, messages = run(tmp_path, launch, watched, "wrong_port")
    assert result.stopped_for_hang, messages
    live = json.loads((sup.out_dir / "report.json").read_text())
    assert live["watchdog"]["how"] == "rendezvous", live["watchdog"]
    assert live["watchdog"]["waited_s"] < 30, live["watchdog"]  # not --stuck-after's 120 s
    for report in (live, replayed(sup.out_dir)):
        assert report["verdict"] == "hang"
        root = root_of(report)
        assert root["kind"] == "blocked_wait" and root["ranks"] == [2], root
        assert "joined another rendezvous than ranks 0, 1" in root["title"], root["title"]
        said = root["evidence"]["rendezvous"]
        assert said["0"] == said["1"] != said["2"], said
        assert "MASTER_PORT" in root["hint"]
        assert {r["rank"] for r in report["ranks"]} == {0, 1, 2}
    # the job is stopped whole: its process group, and every rank that was joining
    assert sup.job is not None and not sup.job.group_alive()
    pids = [j.pid for j in read_joinings(sup.out_dir).values()]
    assert len(pids) == 3
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline and any(psutil.pid_exists(p) for p in pids):
        time.sleep(0.1)
    left = [p for p in pids if psutil.pid_exists(p)
            and psutil.Process(p).status() != psutil.STATUS_ZOMBIE]
    assert not left, left


def test_a_rank_that_never_joins_is_called_after_stuck_after(tmp_path, launch, watched):
    sup, result, messages = run(tmp_path, launch, watched, "absent",
                                HangPolicy(stuck_after=4, sample_every=1))
    assert result.stopped_for_hang, messages
    live = json.loads((sup.out_dir / "report.json").read_text())
    for report in (live, replayed(sup.out_dir)):
        assert report["verdict"] == "hang"
        root = root_of(report)
        assert root["kind"] == "blocked_wait" and root["ranks"] == [2], root
        assert root["title"].startswith("rank 2 never joined the rendezvous"), root["title"]
        assert root["evidence"]["waiting_ranks"] == [0, 1]
        # the absent rank's own process, found on this host: where it is instead
        line = line_of(SCRIPT, "threading.Event().wait()")
        assert root["callsite"].endswith(f"{SCRIPT.name}:{line}"), root["callsite"]
        at = root["evidence"]["absent_at"]["2"]
        assert at["place"] == "outside" and at["frame"].endswith(f"{SCRIPT.name}:{line}"), at
        assert (f"rank 2 (pid {at['pid']}) is running and has not called init_process_group: "
                "it is in its own code, outside torch.distributed at ") in root["detail"]
    # the waiting ranks were seen in the rendezvous, from their stacks
    assert "waits in the rendezvous (init_process_group)" in live["findings"][0]["detail"]


def test_ranks_that_all_join_leave_no_rendezvous_finding(tmp_path, launch, watched):
    sup, result, _ = run(tmp_path, launch, watched, "healthy")
    assert result.exit_status == 0
    for report in (json.loads((sup.out_dir / "report.json").read_text()),
                   replayed(sup.out_dir)):
        assert report["verdict"] == "ok", report["findings"]
        assert not [f for f in report["findings"] if f["kind"] == "blocked_wait"]
