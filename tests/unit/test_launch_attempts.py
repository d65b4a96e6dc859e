"""A job its launcher restarted: each launch attempt's captures and markers told apart (the
attempt a rank's environment names), the last attempt diagnosed, the earlier ones kept as
findings (analysis/attempts.py), and what a restart's ranks say when they cannot connect or
never come out of init_process_group (analysis/what/exited.py, analysis/what/rendezvous.py)."""

from __future__ import annotations

from pathlib import Path

from nccl_doctor.analysis import analyze
from nccl_doctor.analysis.attempts import with_attempts
from nccl_doctor.analysis.calls.loaded import load
from nccl_doctor.analysis.what.exited import connect_failure
from nccl_doctor.analysis.what.rendezvous import ENDED_QUIETLY, stuck_joining
from nccl_doctor.capture import format as fmt
from nccl_doctor.capture.capture_set import CaptureSet
from nccl_doctor.capture.early_exit import read_early_exits, write_early_exit
from nccl_doctor.capture.joining import read_joinings, write_joining
from nccl_doctor.capture.manifest import Manifest
from nccl_doctor.capture.writer import CaptureWriter
from nccl_doctor.diagnosis import Diagnosis, Verdict
from nccl_doctor.env import attempt_of
from nccl_doctor.model import EventKind, EventState, Joining

T0 = 1_700_000_000_000_000_000
RESTART = "TORCHELASTIC_RESTART_COUNT"


def rank(directory: Path, r: int, calls: int, *, restart: int, pid: int,
         clean: bool = True) -> None:
    """Rank ``r`` of a 2-rank job in launch attempt ``restart``: ``calls`` all_reduces."""
    started = T0 + restart * 10**10
    w = CaptureWriter(directory / f"rank{r:05d}.vm.{pid}{fmt.CAPTURE_SUFFIX}",
                      {"rank": r, "world_size": 2, "host": "vm", "pid": pid,
                       "started_ns": started, "env": {RESTART: str(restart)}})
    w.note("group", name="0", ranks=[0, 1], backend="gloo")
    site = w.intern("/job/train.py")
    for i in range(calls):
        idx = w.begin((0, started + i * 1000, i + 1, 256, 1, w.intern("all_reduce"),
                       w.intern("0"), w.intern("float32[8]"), 0, site, 10 + r, w.intern("step"),
                       site, 10 + r, 0, -1, 2, 0, int(EventKind.COLLECTIVE), 0, 0))
        w.end(idx, int(EventState.RETURNED), 1)
    if clean:
        w.note("exit")


def restarted_job(tmp_path: Path) -> Path:
    """Attempt 1: rank 1 stops after 2 calls, rank 0 waits in its third; attempt 2: both
    make 3 calls and exit cleanly."""
    out = tmp_path / "out"
    out.mkdir()
    rank(out, 0, 3, restart=0, pid=100, clean=False)
    rank(out, 1, 2, restart=0, pid=101, clean=False)
    rank(out, 0, 3, restart=1, pid=200)
    rank(out, 1, 3, restart=1, pid=201)
    Manifest(command=("torchrun", "train.py"), started_at=T0 / 1e9, run_id="r",
             ended_at=T0 / 1e9 + 60, exit_status=0).write(out)
    return out


def test_the_attempt_is_the_restart_counts_a_rank_s_environment_names():
    assert attempt_of({}) == (0, 0)
    assert attempt_of({RESTART: "2"}) == (0, 2)
    assert attempt_of({"SLURM_RESTART_COUNT": "1", RESTART: "0"}) == (1, 0)
    assert attempt_of({RESTART: "x"}) == (0, 0)  # (not a count: the first)


def test_the_latest_attempt_is_read_alone_and_the_earlier_one_kept_as_a_finding(tmp_path):
    out = restarted_job(tmp_path)
    captures = CaptureSet(out)
    assert captures.attempts() == {(0, 0): T0, (0, 1): T0 + 10**10}
    assert sorted(p.name for p in captures.chosen().values()) == [
        "rank00000.vm.200.ndcap", "rank00001.vm.201.ndcap"]
    last = analyze(load(out))
    assert last.verdict is Verdict.OK and not any("several captures" in n for n in last.notes)
    d = with_attempts(last, [out], analyze)
    assert d.verdict is Verdict.OK  # the last attempt's
    first, second = d.attempts
    assert (first.number, first.restart, first.verdict) == (1, 0, "crash")
    assert (second.number, second.restart, second.verdict) == (2, 1, "ok")
    earlier = [f for f in d.findings if f.attempt is not None]
    assert len(earlier) == 1 and earlier[0].attempt == 1 and not earlier[0].root_cause
    assert earlier[0].title.startswith("attempt 1: ") and earlier[0].ranks == (1,)
    assert first.summary in earlier[0].title
    assert any("launched 2 times" in n and "attempt 2's" in n for n in d.notes)
    again = Diagnosis.from_json(d.to_json())  # report.json carries them
    assert again is not None and again.attempts == d.attempts
    assert [f.attempt for f in again.findings] == [f.attempt for f in d.findings]
    # an earlier attempt read on its own is that job, diagnosed as any job is
    alone = analyze(load_attempt(out, (0, 0)))
    assert alone.verdict is not Verdict.OK and alone.root_cause.ranks == (1,)


def load_attempt(out: Path, attempt: tuple[int, int]):
    from nccl_doctor.analysis.calls.loaded import loaded

    return loaded(CaptureSet(out, attempt=attempt, job_ended=True))


def test_a_job_never_restarted_is_left_as_it_is(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    rank(out, 0, 3, restart=0, pid=100)
    rank(out, 1, 3, restart=0, pid=101)
    d = analyze(load(out))
    assert with_attempts(d, [out], analyze) is d


def test_an_attempt_whose_ranks_never_made_a_capture_is_the_latest(tmp_path, monkeypatch):
    """A restart that died connecting its ranks: its markers alone say it was launched."""
    out = restarted_job(tmp_path)
    monkeypatch.setenv(RESTART, "2")
    write_joining(out, 0, 2, "vm", local_world_size=2, address="localhost:29500",
                  backend="gloo", time_ns=T0 + 3 * 10**10)
    write_early_exit(out, 1, 2, "vm", {
        "type": "RuntimeError", "in_init": True, "time_ns": T0 + 3 * 10**10,
        "message": "Gloo connectFullMesh failed with [pair.cc:152] timed out connecting: "
                   "SO_ERROR: Connection refused, remote=[127.0.0.1]:52132$0"})
    assert list(CaptureSet(out).attempts()) == [(0, 0), (0, 1), (0, 2)]
    assert CaptureSet(out).chosen() == {}  # its ranks made no capture
    assert set(read_joinings(out, (0, 2))) == {0} and read_joinings(out, (0, 1)) == {}
    assert set(read_early_exits(out, (0, 2))[0]) == {1} and read_early_exits(out, (0, 0))[0] == {}
    d = with_attempts(analyze(load(out)), [out], analyze)
    root = d.root_cause
    assert root is not None and root.attempt is None and root.ranks == (1,)
    assert root.title == ("rank 1 failed connecting to its peers in init_process_group: "
                          "connection refused, connecting to 127.0.0.1:52132")
    assert "attempt 3 of its launcher" in root.detail
    assert [a.verdict for a in d.attempts] == ["crash", "ok", d.verdict.value]


def test_a_connection_failure_is_told_from_any_other_error():
    assert connect_failure("RuntimeError: Gloo connectFullMesh failed with [x] timed out "
                           "connecting: SO_ERROR: Connection refused, remote=[10.1.2.3]:4000$1") \
        == "connection refused, connecting to 10.1.2.3:4000"
    assert connect_failure("RuntimeError: Connection reset by peer") == "connection reset by peer"
    assert connect_failure("ValueError: refused to connect the dots") is None


def _joined(*ranks: int) -> dict[int, Joining]:
    return {r: Joining(r, 2, 2, "vm", 300 + r, T0, "localhost:29500", "gloo") for r in ranks}


def test_ranks_that_all_joined_and_none_returned_are_called_with_who_ended_how():
    alive = stuck_joining(_joined(0, 1), {}, 30.0)
    assert alive.title.startswith("ranks 0, 1 have been in init_process_group at "
                                  "localhost:29500 (world size 2) for 30 s")
    assert alive.ranks == (0, 1) and alive.evidence["waiting_ranks"] == [0, 1]
    mixed = stuck_joining(_joined(0, 1), {1: "raised RuntimeError: x"}, 30.0)
    assert mixed.ranks == (1,) and "rank 0 has been" in mixed.title
    assert mixed.title.endswith("after rank 1 ended: rank 1 raised RuntimeError: x")
    gone = stuck_joining(_joined(0, 1), {0: ENDED_QUIETLY, 1: "raised RuntimeError: x"}, 45.0)
    assert "the launcher has run on without them for 45 s" in gone.title
    assert gone.ranks == (1,) and gone.evidence["ended_ranks"] == [0, 1]


def test_the_calls_table_holds_every_attempt_s_calls_with_its_number(tmp_path):
    import nccl_doctor

    out = restarted_job(tmp_path)
    calls = nccl_doctor.open(out).calls
    per = calls.groupby(["attempt", "rank"]).size().to_dict()
    assert per == {(1, 0): 3, (1, 1): 2, (2, 0): 3, (2, 1): 3}
    assert set(calls[calls.attempt == 1].pid) == {100, 101}
    assert set(calls[calls.attempt == 2].pid) == {200, 201}
    assert list(calls.columns[:4]) == ["rank", "host", "pid", "attempt"]
    one = tmp_path / "one"
    one.mkdir()
    rank(one, 0, 2, restart=0, pid=100)
    assert set(nccl_doctor.open(one).calls.attempt) == {1}  # never restarted: attempt 1


def test_a_hang_called_before_these_ranks_started_is_an_earlier_attempt_s(tmp_path):
    """--on-hang restart: the watchdog's hang was called on the ranks it ended; the ranks the
    launcher started after are not hung for it."""
    from dataclasses import replace as with_

    from nccl_doctor.analysis.what.replayed import with_watch
    from nccl_doctor.watch_log import HangCalled, WatchLog
    from nccl_doctor.watch_account import WatchAccount

    out = restarted_job(tmp_path)
    traces = load(out)  # the second attempt: started at T0 + 10 s
    healthy = analyze(traces)
    called = HangCalled(WatchAccount(situation="deadlock"), None, {}, None, at=T0 / 1e9 + 5)
    assert with_watch(healthy, with_(traces, watch=WatchLog((called,)))).verdict is Verdict.OK
    later = with_(called, at=T0 / 1e9 + 15)  # called on these ranks: it stands
    assert with_watch(healthy, with_(traces, watch=WatchLog((later,)))).verdict is Verdict.HANG
