"""Process groups made differently on different ranks (issue 50): real 4-rank gloo jobs
(tests/integration/jobs/group_creation.py) whose ranks wait inside new_group or DeviceMesh
creation, with no collective pending on some of them. The hang is called as a deadlock within
seconds, its root cause is group_mismatch naming the ranks that never made the group and the
line that made it, live and replayed; the healthy twins (every rank makes every group, or
members-only groups with use_local_synchronization=True) read ok."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.integration.test_branch_jobs import line_of, replayed, root_of

pytestmark = pytest.mark.integration

SCRIPT = Path(__file__).parent / "jobs" / "group_creation.py"

# scenario -> (culprit ranks, or None where the ranks' order differs; the line that made the
# group, after which line; words the title holds)
BROKEN = {
    "members_only": ([2, 3], "dist.new_group([0, 1])", 'scenario == "members_only"',
                     "never made process group [0, 1]"),
    "order": (None, "low = dist.new_group([0, 1])", 'scenario == "order"',
              "different order"),
    "subgroups": ([3], "dist.new_subgroups(group_size=2)", None,
                  "never made process group [2, 3]"),
    "mesh_subset": ([1], "init_device_mesh(x.device.type", None,
                    "rank 1 never made process group"),
}


@pytest.mark.parametrize("scenario", sorted(BROKEN))
def test_groups_made_differently_are_a_deadlock_named_at_the_group(run_job, scenario):
    culprits, text, after, words = BROKEN[scenario]
    job = run_job(4, str(SCRIPT), env={"SCENARIO": scenario})
    live = json.loads((job.out / "report.json").read_text())
    # Groups made in another order share torch's names on different ranks: gloo may then
    # connect the wrong peers and fail (a crash) before anything can hang.
    verdicts = ("hang", "crash") if scenario == "order" else ("hang",)
    if live["verdict"] == "hang":
        assert live["watchdog"]["how"] == "deadlock", live["watchdog"]
        # called from the ranks' records, within seconds, not after --stuck-after (120 s)
        assert live["watchdog"]["waited_s"] < 30, live["watchdog"]
    line = line_of(SCRIPT, text, after)
    for report in (live, replayed(job.out)):
        assert report["verdict"] in verdicts, [f["title"] for f in report["findings"]]
        root = root_of(report)
        assert root["kind"] == "group_mismatch", root["title"]
        assert words in root["title"], root["title"]
        if culprits is not None:
            assert root["ranks"] == culprits, root
        assert f"{SCRIPT.name}:{line}" in root["title"] + root["detail"], (line, root)
        assert "use_local_synchronization=True" in root["hint"]
    if scenario == "members_only":
        # the same group under two names is said, with the names torch gave it
        assert "is '2' on rank" in root["detail"] and "'1' on rank" in root["detail"], \
            root["detail"]
    if scenario == "order":
        # two groups under one name
        assert "torch's name '1' is group [0, 1] on ranks 0, 1 and group [2, 3] on ranks 2, 3" \
            in root["detail"], root["detail"]
    console = subprocess.run([sys.executable, "-m", "nccl_doctor", "replay", str(job.out)],
                             capture_output=True, text=True, timeout=120)
    assert "ROOT CAUSE group_mismatch" in console.stdout, console.stdout[-3000:]


@pytest.mark.parametrize("scenario", ["healthy", "local"])
def test_groups_made_alike_or_locally_read_ok(run_job, scenario):
    job = run_job(4, str(SCRIPT), env={"SCENARIO": scenario})
    assert job.exit_status == 0
    for report in (json.loads((job.out / "report.json").read_text()), replayed(job.out)):
        assert report["verdict"] == "ok", [f["title"] for f in report["findings"]]
        assert not [f for f in report["findings"] if f["kind"] == "group_mismatch"]
