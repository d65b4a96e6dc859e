"""The live status: rank states from a look at the job, and the bar/line renderers."""

from __future__ import annotations

from nccl_doctor.model import EventState
from nccl_doctor.reporters import status_line
from nccl_doctor.analysis.calls.situation import Assessment, Situation
from nccl_doctor.status_view import LiveView, RankState, RankView
from nccl_doctor.supervisor.view import rank_views


def test_rank_states_follow_the_last_look(tb):
    def _event(rank: int, seq: int):
        return tb.event(seq, "broadcast", state=EventState.ENTERED)

    look = Assessment(Situation.WAITING_ON_PEERS, live=(0, 1, 2, 3),
                      waiting={0: _event(0, 57), 2: _event(2, 57)}, awaited=(1,), stopped=(3,),
                      cause=None)
    views = rank_views({0: 120, 1: 118, 2: 120, 3: 119, 4: 5}, {0: "a"}, look, set())
    states = {v.rank: v.state for v in views}
    assert states == {0: RankState.WAITING, 1: RankState.AWAITED, 2: RankState.WAITING,
                      3: RankState.STOPPED, 4: RankState.ENDED}
    assert views[0].detail == "broadcast #57 (group 0)" and views[0].host == "a" and views[0].calls == 120
    # no look at the current counters: every rank is simply running
    assert {v.state for v in rank_views({0: 1, 1: 1}, {}, None, set())} == {RankState.RUNNING}


def _view(n: int, phase: str = "running", message: str = "") -> LiveView:
    ranks = tuple(RankView(r, "h", 100 + r, RankState.WAITING if r % 2 else RankState.RUNNING)
                  for r in range(n))
    return LiveView(ranks, phase, message, quiet_s=3.2, elapsed_s=3725)


def test_bar_lists_each_rank_until_there_are_too_many():
    small = status_line.bar(_view(4, "waiting_on_peers", "ranks 1, 3 wait")).plain
    assert "4 ranks" in small and "Python calls 0:100 1:101 2:102 3:103" in small
    assert "1:02:05" in small and "waiting on peers" in small and "ranks 1, 3 wait" in small
    assert "no new call for 3 s" in small
    big = status_line.bar(_view(64)).plain
    assert "64 ranks" in big and "Python calls 100-163" in big and "32 running" in big
    assert "32 waiting" in big and " 5:" not in big


def test_bar_fits_one_row_of_the_terminal():
    row = status_line.ansi(status_line.bar(_view(8, "deadlock", "x" * 300)), 80)
    assert "\n" not in row and row.startswith("\x1b[")
    visible = __import__("re").sub(r"\x1b\[[0-9;]*m", "", row)
    assert len(visible) <= 80 and visible.endswith("…")


def test_plain_line_has_counters_and_states():
    text = status_line.line(_view(3, "deadlock", "deadlock suspected"))
    assert text == ("[1:02:05] deadlock; Python calls 0:100 1:101/waiting 2:102; "
                    "deadlock suspected")
    assert "(+2 ranks)" in status_line.line(_view(10))


def test_a_failing_watch_is_dropped_and_named_the_job_supervised_on(tmp_path):
    from nccl_doctor.supervisor.supervisor import Supervisor

    messages: list[str] = []
    sup = Supervisor(["true"], tmp_path, announce=messages.append, gpu=None)
    assert sup.silent is not None and sup.straggler is not None

    def broken(_s):
        raise RuntimeError("disk full")

    sup.silent.look = lambda _snap: broken(sup)  # the watch's own failure, as tick sees it
    sup.tick()
    assert sup.silent not in sup.watches and sup.watchdog in sup.watches
    assert messages == ["silent-error check failed (RuntimeError('disk full')); it is off from here"]


def test_the_supervisor_alone_writes_the_report_and_a_hang_outranks_a_suspicion(tmp_path):
    """Watches return decisions; the supervisor applies them: a hang report stands against a
    later suspicion, a retraction replaces it, and a stop is recorded once."""
    import json

    from nccl_doctor.diagnosis import Diagnosis, Verdict
    from nccl_doctor.supervisor.watching import Decision, Report
    from nccl_doctor.supervisor.supervisor import Supervisor

    messages: list[str] = []
    sup = Supervisor(["true"], tmp_path, announce=messages.append, gpu=None)

    def diagnosis(verdict: Verdict) -> Diagnosis:
        return Diagnosis(verdict=verdict, findings=(), ranks=(), world_size=2)

    def written() -> str:
        return json.loads((tmp_path / "report.json").read_text())["verdict"]

    sup._apply(Decision(report=diagnosis(Verdict.SUSPECT), kind=Report.SUSPECT,
                        announce=("SUSPECT: x",)))
    assert written() == "suspect" and messages == ["SUSPECT: x"]
    sup._apply(Decision(report=diagnosis(Verdict.HANG), announce=("HANG: y",), stop_job=True))
    assert written() == "hang" and sup.stopped_for_hang and sup.stopper.kill_at is not None
    sup._apply(Decision(report=diagnosis(Verdict.SUSPECT), kind=Report.SUSPECT))
    assert written() == "hang"  # the hang report stands
    sup._apply(Decision(report=diagnosis(Verdict.SUSPECT)))  # a retraction (the watchdog's)
    assert written() == "suspect"


def test_watchdog_states_change_only_along_allowed_transitions(tmp_path):
    import pytest

    from nccl_doctor.supervisor.watching import LiveJob
    from nccl_doctor.supervisor.policy import HangPolicy
    from nccl_doctor.supervisor.watchdog import Watchdog, WatchState

    dog = Watchdog(LiveJob(tmp_path, "run", HangPolicy()))
    assert dog.state is WatchState.WATCHING
    with pytest.raises(RuntimeError, match="watching -> hang is not allowed"):
        dog._to(WatchState.HANG)  # a hang is only called after a look
    dog._to(WatchState.LOOKING)
    dog._to(WatchState.HANG)
    dog._to(WatchState.STOPPING)
    with pytest.raises(RuntimeError):
        dog._to(WatchState.WATCHING)  # a job being stopped does not come back
    snap = LiveJob(tmp_path, "run", HangPolicy()).snapshot()
    assert dog.look(snap) is None and dog.stopped_job


def test_the_loop_sleeps_while_nothing_moves_and_ticks_while_it_does(tmp_path, monkeypatch):
    """Every poll_interval while the counters move or a stop is under way; otherwise until the
    soonest look a watch needs (the watchdog's: 1 s after the last progress), at most
    MAX_SLEEP; a watch that cannot say when it needs its look is looked at every tick."""
    from types import SimpleNamespace

    from nccl_doctor.supervisor import supervisor as module
    from nccl_doctor.supervisor.supervisor import Supervisor

    sup = Supervisor(["true"], tmp_path, gpu=None)
    fast = sup.poll_interval
    counts: dict[int, int] = {}
    monkeypatch.setattr(sup.live.registry, "poll", lambda: dict(counts))
    sup.tick()
    assert sup._sleep() == fast  # the first look: everything is new
    sup.tick()
    assert 0.5 < sup._sleep() <= module.MAX_SLEEP  # nothing moved: the watchdog's look is due
    counts[0] = 5  # a rank recorded a call
    sup.tick()
    assert sup._sleep() == fast
    sup.tick()
    assert sup._sleep() > 0.5
    sup.stopper.stopping = True
    assert sup._sleep() == fast
    sup.stopper.stopping = False
    sup.watches.append(SimpleNamespace(what="a watch of a plugin", look=lambda snap: None))
    sup.tick()
    assert sup._sleep() == fast
