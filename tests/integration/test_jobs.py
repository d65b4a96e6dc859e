"""Real torchrun jobs (gloo, CPU) under `Supervisor`: the diagnosis of each failure family."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from nccl_doctor.analysis.calls.align import leaf_collectives
from nccl_doctor.analysis.calls.loaded import load_capture_dir
from nccl_doctor.capture.ring import PURE_PYTHON_ENV
from nccl_doctor.diagnosis import FindingKind, Verdict


def job(name: str) -> str:
    return str(Path(__file__).parent / "jobs" / name)


pytestmark = pytest.mark.integration


def test_padded_all_gather_is_a_shape_mismatch(run_job):
    run = run_job(2, "-m", "nccl_doctor.examples.padded_gather")
    d = run.diagnosis
    assert run.exit_status != 0
    assert d.verdict is Verdict.CRASH
    root = d.root_cause
    assert root is not None and root.kind is FindingKind.COLLECTIVE_MISMATCH
    assert root.evidence["aspect"] == "shape"
    assert (root.group, root.seq, root.op) == ("0", 7, "all_gather")  # 6 metrics, then the logits
    values = {s["value"] for s in root.evidence["sides"]}
    assert values == {"float32[2,7,32]", "float32[2,9,32]"}
    sites = {s["callsite"] for s in root.evidence["sides"]}
    assert len(sites) == 1 and sites.pop().endswith("nccl_doctor/examples/padded_gather.py:32")
    # two ranks, no majority: rank 1 is named against rank 0 (torchfrtrace's convention)
    assert root.ranks == (1,) and "No majority" in root.detail
    # the peers' connection errors are consequences, not findings of their own
    assert not [f for f in d.findings if f.kind is FindingKind.RANK_EXITED]
    report = json.loads((run.out / "report.json").read_text())
    assert report["findings"][0]["kind"] == "collective_mismatch"
    assert report["findings"][0]["seq"] == 7


@pytest.mark.parametrize("nproc,leaver", [(2, 1), (4, 2)])
def test_rank_leaving_early_is_blamed(run_job, nproc, leaver):
    run = run_job(nproc, job("early_exit.py"), env={"LEAVER": str(leaver)})
    d = run.diagnosis
    assert run.exit_status != 0  # the peers failed
    root = d.root_cause
    assert root is not None and root.kind is FindingKind.RANK_EXITED, d.findings
    assert root.ranks == (leaver,)
    assert root.evidence["exit"] == "exit" and root.evidence["exit_code"] == 0
    assert "early_exit.py:16" in root.title  # where it left: after its last all_reduce
    assert root.evidence["last_collective"] == "all_reduce #3 (group 0)"
    assert "while its peers still needed it" in root.title
    # the peers' "Connection closed" errors are reported as consequences only
    others = [r for r in range(nproc) if r != leaver]
    assert {c["rank"] for c in root.evidence.get("consequences", [])} <= set(others)
    missing = [f for f in d.findings if f.kind is FindingKind.MISSING_COLLECTIVE]
    assert missing and missing[0].ranks == (leaver,) and missing[0].seq == 4
    assert not any(set(f.ranks) & set(others) for f in d.findings)


@pytest.mark.parametrize("destroy", ["1", "0"])
def test_ranks_leaving_without_atexit_after_their_work_are_finished_not_crashed(run_job, destroy):
    """os._exit after the last collective (Ray ends its workers so): no exit record, but the
    work finished - noted at destroy_process_group, or judged from the calls and the job's 0."""
    run = run_job(2, job("quick_exit.py"), env={"DESTROY": destroy})
    d = run.diagnosis
    assert run.exit_status == 0
    assert d.verdict is Verdict.OK and d.findings == (), [f.title for f in d.findings]
    assert {r.state for r in d.ranks} == {"finished"}
    notes = [n for t in load_capture_dir(run.out).ranks.values() for n in t.notes]
    assert any(n.get("note") == "destroyed" for n in notes) == (destroy == "1")
    assert not any(n.get("note") == "exit" for n in notes)  # atexit never ran


def test_op_mismatch_names_the_odd_rank(run_job):
    run = run_job(4, job("op_mismatch.py"))
    d = run.diagnosis
    root = d.root_cause
    assert root is not None and root.kind is FindingKind.COLLECTIVE_MISMATCH, d.findings
    assert root.evidence["aspect"] == "op"
    assert root.ranks == (1,)
    assert root.evidence["majority"] == [0, 2, 3]
    assert root.seq == 3 and root.group == "0"
    ops = {s["op"] for s in root.evidence["sides"]}
    assert ops == {"all_reduce", "broadcast"}
    assert root.callsite.endswith("op_mismatch.py:15")


@pytest.mark.parametrize("nproc,ring", [(2, "default"), (4, "default"), (4, "python")])
def test_clean_job_is_ok(run_job, nproc, ring):
    """``ring``: the C ring where it was built, or the pure-Python one forced."""
    env = {PURE_PYTHON_ENV: "1"} if ring == "python" else {PURE_PYTHON_ENV: "0"}
    run = run_job(nproc, job("clean.py"), env=env)
    d = run.diagnosis
    assert run.exit_status == 0
    assert d.verdict is Verdict.OK, [f.title for f in d.findings]
    assert d.findings == ()
    assert len(d.ranks) == nproc and all(r.state == "exited" for r in d.ranks)
    # every rank recorded the same collectives of the world group, in the same order
    ts = load_capture_dir(run.out)
    per_rank = {
        r: [(e.op, e.align_seq) for e in leaf_collectives(t) if e.group == "0"]
        for r, t in ts.ranks.items()
    }
    assert len({tuple(v) for v in per_rank.values()}) == 1
    assert len(per_rank[0]) >= 3 * 6


def test_a_rank_that_cannot_make_its_capture_runs_unseen_not_missing(run_job, tmp_path):
    """Rank 2 of 3 cannot create its capture file (RLIMIT_FSIZE: EFBIG, as ENOSPC on a full
    disk): the job runs to the end, the rank says so in one line and leaves a marker, and the
    report is OK with a note - never a missing_collective against it. Replay agrees."""
    run = run_job(3, job("unrecorded.py"), env={"UNRECORDED": "2"})
    d = run.diagnosis
    assert run.exit_status == 0
    assert d.verdict is Verdict.OK and d.findings == (), [f.title for f in d.findings]
    states = {r.rank: (r.state, r.exit_detail, r.host) for r in d.ranks}
    host = states[0][2]
    assert states[2] == ("no_capture", "not recorded (see the note)", host) and host
    assert {states[0][0], states[1][0]} == {"exited"}
    note = next(n for n in d.notes if n.startswith(f"rank 2 on {host} was not recorded: "))
    assert "it cannot create its capture" in note and "File too large" in note
    markers = list(run.out.glob("*.unrecorded"))
    assert len(markers) == 1 and markers[0].name.startswith("rank00002.")
    assert not list(run.out.glob("rank00002.*.ndcap"))
    replayed = load_capture_dir(run.out)
    assert set(replayed.ranks) == {0, 1} and set(replayed.unrecorded) == {2}
    from nccl_doctor.analysis import analyze
    again = analyze(replayed)
    assert again.verdict is Verdict.OK and again.findings == ()


def test_when_no_rank_could_make_its_capture_the_report_says_why(run_job):
    """Every rank refused its capture file (a full disk, as RLIMIT_FSIZE makes it): the report
    says what the ranks said, not that the job's processes were started outside the doctor."""
    from nccl_doctor.analysis.diagnose import NOT_RECORDED_NOTE

    run = run_job(2, job("unrecorded.py"), env={"UNRECORDED": "all"})
    d = run.diagnosis
    assert run.exit_status == 0 and d.findings == ()
    assert NOT_RECORDED_NOTE not in d.notes
    note = next(n for n in d.notes if n.startswith("no rank was recorded, and each said why: "))
    assert note.count("File too large") == 1 and "ranks 0, 1: " in note  # (one reason, said once)
    assert {r.state for r in d.ranks} == {"no_capture"}
