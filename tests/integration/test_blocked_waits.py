"""A rank blocked outside any collective while its peers wait in one (issue 50): real 2-rank
gloo jobs (tests/integration/jobs/blocked_waits.py). A rank in a store-based wait of torch's
is blocked as surely as one in a collective: the hang is called within seconds, from its
stack, as blocked_wait. A rank waiting on its DataLoader's stuck worker is named by the
silent-watch policy (--stuck-after, shortened here) with the worker's own stack and line."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from nccl_doctor.supervisor.policy import HangPolicy
from tests.integration.test_branch_jobs import line_of, replayed, root_of

pytestmark = pytest.mark.integration

SCRIPT = Path(__file__).parent / "jobs" / "blocked_waits.py"


def test_a_rank_in_a_store_wait_while_its_peer_waits_in_a_collective_is_a_deadlock(
        tmp_path, launch, watched):
    sup, messages = watched(launch(2, str(SCRIPT)), tmp_path / "out", {"SCENARIO": "store_wait"})
    result = sup.run()
    assert result.stopped_for_hang, messages
    live = json.loads((sup.out_dir / "report.json").read_text())
    # from the stacks, at once: not after --stuck-after (120 s by default)
    assert live["watchdog"]["waited_s"] < 30, live["watchdog"]
    line = line_of(SCRIPT, "barrier(store, 2")
    for report in (live, replayed(sup.out_dir)):
        assert report["verdict"] == "hang"
        root = root_of(report)
        assert root["kind"] == "blocked_wait", root["title"]
        assert root["ranks"] == [1], root
        assert "store-based wait" in root["title"] and "all_reduce #2" in root["title"], root
        assert root["callsite"].endswith(f"{SCRIPT.name}:{line}"), root["callsite"]
        assert root["evidence"]["place"] == {"1": "store"}, root["evidence"]


def test_a_rank_waiting_on_a_stuck_dataloader_worker_names_the_workers_line(
        tmp_path, launch, watched):
    sup, messages = watched(launch(2, str(SCRIPT)), tmp_path / "out", {"SCENARIO": "dataloader"},
                            HangPolicy(stuck_after=4, sample_every=1))
    result = sup.run()
    assert result.stopped_for_hang, messages
    line = line_of(SCRIPT, "self.never.wait()")
    for report in (json.loads((sup.out_dir / "report.json").read_text()),
                   replayed(sup.out_dir)):
        assert report["verdict"] == "hang"
        root = root_of(report)
        assert root["kind"] == "missing_collective" and root["ranks"] == [1], root
        assert "waiting on its DataLoader's workers" in root["detail"], root["detail"]
        # the worker's own line, in the dataset: where the batch is held up
        assert f"{SCRIPT.name}:{line} in Batches.__getitem__" in root["detail"], root["detail"]
        assert "different number of times" not in root["detail"]
        assert "DataLoader" in root["hint"] and "timeout=" in root["hint"], root["hint"]
