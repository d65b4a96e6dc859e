"""The live watchdog on real hung (and healthy) gloo jobs: diagnosed while the job runs."""

from __future__ import annotations

import json
import os
import signal
import threading
import time
from pathlib import Path

import psutil
import pytest

from nccl_doctor.capture.names import capture_files
from nccl_doctor.capture.reader import read_progress
from nccl_doctor.diagnosis import FindingKind, Verdict
from nccl_doctor.errors import ExitStatus
from nccl_doctor.supervisor.supervisor import Supervisor
from nccl_doctor.supervisor.policy import HangPolicy, OnHang

pytestmark = pytest.mark.integration

JOBS = Path(__file__).parent / "jobs"


@pytest.fixture
def supervise(tmp_path: Path, launch, watched):
    def make(nproc: int, script: str, env: dict[str, str] | None = None,
             policy: HangPolicy | None = None) -> tuple[Supervisor, list[str]]:
        return watched(launch(nproc, str(JOBS / script)), tmp_path / "out", env, policy)

    return make


def report(sup: Supervisor) -> dict:
    return json.loads((sup.out_dir / "report.json").read_text())


def assert_job_gone(sup: Supervisor) -> None:
    """No process of the job is left: neither its process group nor a rank (torchrun starts
    each rank in a session of its own, outside the group)."""
    assert sup.job is not None
    assert not sup.job.group_alive(), "processes of the job outlived it"
    ranks = sup.live.registry.ranks
    assert ranks, "the registry found no rank"
    deadline = time.monotonic() + 5  # a SIGKILLed rank is gone at once; its reaping may lag
    while time.monotonic() < deadline and any(_running(r.pid) for r in ranks.values()):
        time.sleep(0.1)
    left = {r: p.pid for r, p in ranks.items() if _running(p.pid)}
    assert not left, f"ranks outlived the job: {left}"
    members = []
    for p in psutil.process_iter(["pid", "status"]):
        try:
            if os.getpgid(p.pid) == sup.job.pgid and p.info["status"] != psutil.STATUS_ZOMBIE:
                members.append(p.pid)
        except (ProcessLookupError, psutil.Error):
            continue
    assert not members, f"processes of the job still alive: {members}"


def _running(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def test_skipped_broadcast_is_a_deadlock_blaming_the_skipper(stopped_hang):
    run = stopped_hang("skip_broadcast")  # 3 ranks, rank 1 skips the broadcast
    sup, messages, result = run.sup, run.messages, run.result
    d = result.diagnosis
    assert result.stopped_for_hang and result.exit_status == ExitStatus.HANG_STOPPED
    assert d.verdict is Verdict.HANG
    root = d.root_cause
    assert root is not None and root.kind is FindingKind.COLLECTIVE_MISMATCH, messages
    assert root.ranks == (1,)
    assert {s["op"] for s in root.evidence["sides"]} == {"broadcast", "all_reduce"}
    sides = {s["op"]: s["callsite"] for s in root.evidence["sides"]}
    assert sides["broadcast"].endswith("skip_broadcast.py:19")
    assert sides["all_reduce"].endswith("skip_broadcast.py:15")
    # diagnosed from the deadlock in seconds, not at gloo's 30-minute timeout
    rep = report(sup)
    assert rep["watchdog"]["situation"] == "deadlock" and rep["watchdog"]["waited_s"] < 10
    assert rep["verdict"] == "hang" and rep["stack_classes"], rep
    assert all(r["stack_summary"] for r in rep["ranks"])
    assert any(m.startswith("HANG") for m in messages)
    assert_job_gone(sup)


@pytest.mark.parametrize("name", ["skip_broadcast", "ddp_uneven"])
def test_the_supervisor_reads_back_nothing_it_wrote_and_writes_each_file_once(stopped_hang,
                                                                              name):
    """One hang, ring to report: the supervisor reads none of its own files back, opens no
    capture once the job ended (its followers hold them), and writes each file only when what
    it says changed (the manifest twice: at the start and at the end)."""
    audit = stopped_hang(name).audit
    audit.assert_once()
    assert "stacks.json" in audit.writes
    if name == "ddp_uneven":  # its C++ all_reduce came through Flight Recorder pulls
        assert any(n.startswith("flight_recorder") for n in audit.writes), audit.writes


def test_sharded_generate_with_uneven_lengths_deadlocks(supervise):
    sup, messages = supervise(2, "sharded_generate.py")
    result = sup.run()
    root = result.diagnosis.root_cause
    assert result.diagnosis.verdict is Verdict.HANG, messages
    assert root is not None and root.kind is FindingKind.COLLECTIVE_MISMATCH
    assert {s["op"] for s in root.evidence["sides"]} == {"all_gather", "all_reduce"}
    assert root.ranks in ((0,), (1,), (0, 1))
    assert any("sharded_generate.py:12" in s["callsite"] for s in root.evidence["sides"])
    assert report(sup)["watchdog"]["waited_s"] < 10
    assert_job_gone(sup)


def _pids_when_running(out: Path, nproc: int, timeout: float = 60) -> dict[int, int]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        pids = {}
        for f in capture_files(out):
            try:
                meta, started = read_progress(f)
            except Exception:
                continue
            if started >= 4:
                pids[meta["rank"]] = meta["pid"]
        if len(pids) == nproc:
            return pids
        time.sleep(0.2)
    raise AssertionError("the job never started recording")


def _stop_outside_collectives(out: Path, rank: int, pid: int, tries: int = 50) -> None:
    """SIGSTOP ``pid``; if its capture then shows it inside a collective, let it go and retry."""
    from nccl_doctor.analysis.calls.align import blocked_event
    from nccl_doctor.capture.follow import read_capture

    path = next(f for f in capture_files(out) if read_progress(f)[0]["rank"] == rank)
    for _ in range(tries):
        os.kill(pid, signal.SIGSTOP)
        if blocked_event(read_capture(path)) is None:
            return
        os.kill(pid, signal.SIGCONT)
        time.sleep(0.05)
    raise AssertionError(f"rank {rank} was always inside a collective")


def test_stopped_rank_is_a_hang_with_its_stack(supervise):
    sup, messages = supervise(3, "train_loop.py", {"STEPS": "400", "PAUSE": "0.3"})
    box = {}
    thread = threading.Thread(target=lambda: box.setdefault("result", sup.run()))
    thread.start()
    victim = None
    try:
        pids = _pids_when_running(sup.out_dir, 3)
        victim = pids[2]
        _stop_outside_collectives(sup.out_dir, 2, victim)  # in its compute pause
        thread.join(90)
        assert not thread.is_alive(), "the watchdog never called the hang"
    finally:
        if victim is not None and psutil.pid_exists(victim):
            os.kill(victim, signal.SIGCONT)
            os.kill(victim, signal.SIGKILL)
        thread.join(30)
    result = box["result"]
    d = result.diagnosis
    assert d.verdict is Verdict.HANG and result.stopped_for_hang, messages
    root = d.root_cause
    assert root is not None and root.kind is FindingKind.MISSING_COLLECTIVE
    assert root.ranks == (2,)
    assert "stopped" in root.evidence["stuck"]["2"]
    assert "train_loop.py" in root.detail and "compute" in root.detail  # where it stopped
    summary = {r.rank: r.stack_summary for r in d.ranks}
    assert "py-spy" in summary[2] and "compute" in summary[2]
    assert_job_gone(sup)


@pytest.mark.parametrize("env, policy", [
    ({"SLOW_RANK": "1", "SLOW_SECONDS": "3", "STEPS": "4"}, None),  # a straggler
    # rank 0 evaluates for twice the time that makes an idle, unchanged rank stuck: busy is not
    ({"BUSY_RANK": "0", "BUSY_SECONDS": "12", "STEPS": "3", "BUSY_STEP": "1"},
     HangPolicy(stuck_after=6, sample_every=1)),
], ids=["straggler", "rank0-busy-12s"])
def test_healthy_slow_jobs_are_not_hangs(supervise, env, policy):
    sup, messages = supervise(3, "train_loop.py", env, policy)
    result = sup.run()
    assert result.exit_status == 0, messages
    assert not result.stopped_for_hang
    assert result.diagnosis.verdict is Verdict.OK, [f.title for f in result.diagnosis.findings]
    assert not any(m.startswith("HANG") for m in messages)
    if "BUSY_RANK" in env:  # the watchdog did look, and saw a busy peer, not a stuck one
        assert any("outside collectives): watching" in m for m in messages), messages


def test_report_policy_keeps_the_job_and_the_report(supervise):
    policy = HangPolicy(on_hang=OnHang.REPORT)
    sup, messages = supervise(2, "skip_broadcast.py", {"SKIPPER": "1"}, policy)
    box = {}
    thread = threading.Thread(target=lambda: box.setdefault("result", sup.run()))
    thread.start()
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and not (sup.out_dir / "report.json").exists():
            time.sleep(0.2)
        rep = report(sup)  # written the moment the hang was diagnosed, with the job still up
        assert rep["verdict"] == "hang" and rep["watchdog"]["action"] == "reported"
        assert sup.job is not None and sup.job.group_alive()
    finally:
        if sup.job is not None:
            sup.job.signal(signal.SIGKILL)
        thread.join(60)
    result = box["result"]
    assert not result.stopped_for_hang and result.exit_status != ExitStatus.HANG_STOPPED
    assert result.diagnosis.verdict is Verdict.HANG  # the hang stays the verdict
    assert_job_gone(sup)


def test_without_pyspy_stacks_come_from_the_in_rank_agent(supervise, monkeypatch):
    monkeypatch.setenv("NCCL_DOCTOR_PYSPY", "none")  # the supervisor's py-spy lookup
    sup, messages = supervise(3, "skip_broadcast.py", {"SKIPPER": "2"})
    result = sup.run()
    d = result.diagnosis
    assert d.verdict is Verdict.HANG and d.root_cause.ranks == (2,), messages
    summaries = {r.rank: r.stack_summary for r in d.ranks}
    assert all("[agent]" in s and "skip_broadcast.py" in s for s in summaries.values()), summaries
    assert {src for c in d.stack_classes for src in c.sources} == {"agent"}
    # classes follow where each rank waits: the skipper in all_reduce (line 15), the root rank 0
    # in the broadcast (line 19); rank 1's broadcast completed, so it waits in all_reduce too
    where = {r: c.frames for c in d.stack_classes for r in c.ranks}
    assert any("skip_broadcast.py:15" in f for f in where[2])
    assert any("skip_broadcast.py:19" in f for f in where[0])
    assert len(d.stack_classes) == 2 and any(c.odd for c in d.stack_classes)
    assert_job_gone(sup)


def test_ddp_uneven_batches_is_a_desync_seen_through_flight_recorder(stopped_hang):
    """Rank 0's extra backward all-reduces from C++; rank 1 waits in the barrier after its loop."""
    run = stopped_hang("ddp_uneven")
    sup, messages, result = run.sup, run.messages, run.result
    d = result.diagnosis
    assert d.verdict is Verdict.HANG and result.stopped_for_hang, messages
    root = d.root_cause
    assert root is not None and root.kind is FindingKind.COLLECTIVE_MISMATCH, d.findings
    assert root.evidence["aspect"] == "op" and root.group == "0"
    sides = {s["op"]: s for s in root.evidence["sides"]}
    assert set(sides) == {"all_reduce", "barrier"}
    # issued from C++, placed by the Python stack Flight Recorder kept: the backward line
    backward = 1 + (JOBS / "ddp_uneven.py").read_text().splitlines().index(
        "        loss.backward()  # DDP all-reduces the gradients here, from C++")
    assert sides["all_reduce"]["ranks"] == [0]
    assert sides["all_reduce"]["callsite"].endswith(
        f"ddp_uneven.py:{backward} (issued from C++ during backward)"), sides
    assert "<" not in json.dumps(root.to_json())  # no placeholder callsite anywhere
    assert sides["barrier"]["ranks"] == [1] and sides["barrier"]["callsite"].endswith("ddp_uneven.py:23")
    # the right sequence number: the one PyTorch gave rank 1's barrier (from its capture), which
    # rank 0's fifth gradient all_reduce took there
    from nccl_doctor.analysis.calls.loaded import load_capture_dir

    barrier = [e for e in load_capture_dir(sup.out_dir).ranks[1].events if e.op == "barrier"]
    assert root.seq == barrier[-1].align_seq, root.title
    assert report(sup)["watchdog"]["waited_s"] < 30
    assert_job_gone(sup)


def test_every_rank_idle_outside_collectives_is_a_stall_after_hang_after(supervise):
    policy = HangPolicy(hang_after=8, stuck_after=3, sample_every=1)
    sup, messages = supervise(2, "no_collectives.py", {"MODE": "idle"}, policy)
    result = sup.run()
    d = result.diagnosis
    assert d.verdict is Verdict.HANG and result.stopped_for_hang, messages
    root = d.root_cause
    assert root.kind is FindingKind.STALL and root.evidence["idle"], root
    assert root.ranks == (0, 1) and root.evidence["class"] == "compute"
    assert "no_collectives.py" in root.detail and "wait_for_batch" in root.detail
    assert report(sup)["watchdog"]["waited_s"] >= 8
    assert_job_gone(sup)


def test_every_rank_busy_outside_collectives_is_not_a_hang(supervise):
    # busier than --hang-after, with no collective at all: a long generation, nothing waits
    policy = HangPolicy(hang_after=4, stuck_after=2, sample_every=1)
    sup, messages = supervise(2, "no_collectives.py", {"MODE": "busy", "SECONDS": "9"}, policy)
    result = sup.run()
    assert result.exit_status == 0 and not result.stopped_for_hang, messages
    assert result.diagnosis.verdict is Verdict.OK


def test_a_consistently_late_rank_is_a_straggler_not_a_hang(supervise, monkeypatch):
    from nccl_doctor.supervisor import straggler_watch

    # rank 1 is late by 1 s a step: a sample (a capture read, then py-spy, which takes up to a
    # second on a loaded 2-core machine) must fit inside its late phase to count
    sup, messages = supervise(3, "train_loop.py", {"SLOW_RANK": "1", "SLOW_SECONDS": "1.0",
                                                   "STEPS": "24", "PAUSE": "0.05"})
    sup.straggler.every = 0.5  # the default (10 s) outlasts this short job
    # nor may the back-off after a slow look (20x its duration) leave this job a single sample
    monkeypatch.setattr(straggler_watch, "DUTY", 2.0)
    result = sup.run()
    assert result.exit_status == 0 and not result.stopped_for_hang, messages
    d = result.diagnosis
    assert d.verdict is Verdict.SUSPECT
    assert [f.kind for f in d.findings] == [FindingKind.STRAGGLER], [f.title for f in d.findings]
    f = d.findings[0]
    assert f.ranks == (1,) and f.evidence["last"]["1"] >= 20
    assert 200 <= f.evidence["median_ms"] <= 2000 and "train_loop.py" in f.detail
    # what it did while ranks 0 and 2 waited: its stack, sampled without pausing it
    doing = f.evidence["doing"]["1"]
    line = 1 + (JOBS / "train_loop.py").read_text().splitlines().index(
        "    time.sleep(seconds)  # the straggler's extra work (a slow input pipeline)")
    assert doing[0]["frame"].endswith(f"train_loop.py:{line} in load_batch"), doing
    assert doing[0]["samples"] >= 2 and doing[0]["samples"] >= 0.8 * doing[0]["of"], doing
    assert "While its peers waited, rank 1 was at " in f.detail
    assert f"train_loop.py:{line} in load_batch" in f.detail
    samples = [json.loads(x) for x in (sup.out_dir / "stragglers.jsonl").read_text().splitlines()]
    assert {s["rank"] for s in samples} == {1} and all(s["waiting"] for s in samples)


def test_a_call_returned_but_never_completed_counts_as_waiting(supervise):
    """NCCL completion, on gloo: rank 0's async all_reduce returned on the CPU and never completed
    (Flight Recorder: not retired). Both ranks are idle outside Python collectives; without the
    completion state that is a compute stall after --hang-after (60 s here). With it, rank 0 waits
    in the all_reduce and rank 1, idle with an unchanged stack, is the stuck peer."""
    policy = HangPolicy(hang_after=60, stuck_after=3, sample_every=1)
    sup, messages = supervise(2, "async_unwaited.py", policy=policy)
    result = sup.run()
    d = result.diagnosis
    assert d.verdict is Verdict.HANG and result.stopped_for_hang, messages
    assert d.watchdog.how == "stuck_peer", d.watchdog
    root = d.root_cause
    # rank 0 made the call inside `if rank == 0:` and rank 1 is in its else: the branch on the
    # rank, not the wait, says who is wrong (issue 39); rank 1's stuck wait is still said
    assert root.kind is FindingKind.MISSING_COLLECTIVE and root.ranks == (0,), root
    branch = 1 + (JOBS / "async_unwaited.py").read_text().splitlines().index("if rank == 0:")
    assert root.branch.line == branch and root.branch.text == "if rank == 0:", root.branch
    assert root.evidence["missing_ranks"] == [1]
    assert root.op == "all_reduce" and root.callsite.endswith("async_unwaited.py:22")
    assert root.evidence["waiting_states"] == {"0": "in_flight"}
    assert "never completed (Flight Recorder)" in root.detail
    assert "async_unwaited.py:18" in root.detail  # where the stuck rank is
    assert_job_gone(sup)


def test_spinning_gpus_of_a_deadlock_are_called_gpu_busy_hang(tmp_path, launch):
    """The skipped-broadcast deadlock, with GPUs played back from readings published with a real
    hung H100 job (no GPU here): each rank placed on its device through its real environment
    (CUDA_VISIBLE_DEVICES reversed, LOCAL_RANK), sampled fast once nothing moves. The job calls
    init_process_group() with no backend (recorded "undefined", as on a GPU box where NCCL would
    carry CUDA tensors); a group known to be gloo-only is never said to spin NCCL kernels."""
    readings = json.loads((Path(__file__).parents[1] / "fixtures" / "gpu" /
                           "published_readings.json").read_text())["readings"]
    spin = [r for r in readings if r["state"] == "spin" and "6524" in r["source"]]
    from nccl_doctor.supervisor.gpu.recorded import RecordedGpus

    source = RecordedGpus({i: spin for i in range(3)})
    messages: list[str] = []
    sup = Supervisor(launch(3, str(JOBS / "skip_broadcast.py")), tmp_path / "out",
                     environ=dict(os.environ, SKIPPER="1", CUDA_VISIBLE_DEVICES="2,1,0",
                                  BACKEND=""),
                     announce=messages.append, gpu=lambda: source)
    result = sup.run()
    d = result.diagnosis
    assert d.verdict is Verdict.HANG and d.root_cause.kind is FindingKind.COLLECTIVE_MISMATCH
    (f,) = [f for f in d.findings if f.kind is FindingKind.GPU_BUSY_HANG]
    assert f.ranks == (1,) and f.evidence["waiting_for"] == [1] and not f.root_cause
    spinning = f.evidence["spinning"]
    assert set(spinning) == {"0", "1", "2"}, spinning
    assert {r: s["gpu"] for r, s in spinning.items()} == {"0": 2, "1": 1, "2": 0}
    assert all(s["placed_by"] == "environment" and s["samples"] >= 3 for s in spinning.values())
    assert "waiting for rank 1" in f.title
    rep = report(sup)
    assert any(x["kind"] == "gpu_busy_hang" for x in rep["findings"])
    assert source.closed
    assert_job_gone(sup)
