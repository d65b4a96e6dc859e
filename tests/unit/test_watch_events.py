"""The watchdog's events as typed values: one JSON form written and read back, the live hang
report carried as a value to the end of the run, and replay reaching the same report from
watchdog.json (issue 42: one typed post mortem)."""

from __future__ import annotations

import json
from dataclasses import replace

from nccl_doctor.analysis import analyze
from nccl_doctor.analysis.what.hang import hang_diagnosis
from nccl_doctor.capture import watch_record
from nccl_doctor.diagnosis import Diagnosis, Finding, FindingKind, Severity, Verdict
from nccl_doctor.sections import StackClass
from nccl_doctor.watch_account import WatchAccount
from nccl_doctor.watch_log import (EXIT_REQUEST, Aftermath, HangCalled, Interrupted, Retracted,
                                   Stopped, SupervisorLost, WatchLog, event_from_json)

ACCOUNT = WatchAccount(situation="deadlock", how="stuck_peer", waited_s=0.0, policy="kill",
                       action="stopped the job")


def _root(rank: int = 1) -> Finding:
    return Finding(kind=FindingKind.MISSING_COLLECTIVE, severity=Severity.ERROR,
                   title=f"rank {rank} never came", detail="", ranks=(rank,), group="0", seq=4,
                   op="all_reduce", root_cause=True)


def _live(traces) -> Diagnosis:
    """A live hang report as the watchdog makes it: the analysis then, its root, its stacks."""
    stacked = replace(analyze(traces, annotators=()),
                      stack_classes=(StackClass(ranks=(1,), odd=True, frames=("a.py:1 f",),
                                                sources=("py-spy",)),))
    return hang_diagnosis(stacked, _root(), {}, ACCOUNT, annotators=())


def test_every_event_reads_back_as_written():
    events = (HangCalled(ACCOUNT, _root(), {0: ("0", 4), 2: ("0", 4)}, at=10.0),
              Stopped((EXIT_REQUEST,), at=11.0), Stopped(("SIGTERM",), at=12.5),
              Interrupted(("SIGINT",), "user", at=13.0), Aftermath("rank 0 timed out", at=14.0),
              Retracted(at=15.0), SupervisorLost(("SIGTERM", "SIGKILL"), at=16.0))
    text = watch_record.watch_text(events)
    back = tuple(event_from_json(e) for e in json.loads(text)["events"])
    assert back == events


def test_garbage_events_are_passed_over_not_trusted():
    raw = [{"event": "hang", "at": "noon"}, {"event": "from_the_future", "at": 1.0}, "text",
           {"event": "stop", "at": 2.0, "signals": "SIGKILL"},
           {"event": "hang", "at": 3.0, "watchdog": {"waited_s": "x", "retracted": "yes"},
            "root": {"kind": "nonsense"}, "stuck": {"0": ["0"], "x": ["0", 1]}, "report": [1]}]
    got = [event_from_json(e) for e in raw]
    assert got[:3] == [None, None, None]
    assert got[3] == Stopped((), at=2.0)  # a signals list that is not a list: none
    hang = got[4]
    assert isinstance(hang, HangCalled) and hang.root is None and hang.report is None
    assert hang.stuck == {} and hang.account == WatchAccount()


def test_the_live_report_travels_with_the_standing_hang_only(tb):
    traces = tb.scenarios["hang_missing"]()
    live = _live(traces)
    first = HangCalled(ACCOUNT, _root(), report=live, at=1.0)
    again = HangCalled(ACCOUNT, _root(), report=live, at=3.0)
    doc = json.loads(watch_record.watch_text((first, Retracted(at=2.0), again)))
    assert ["report" in e for e in doc["events"]] == [False, False, True]
    log = WatchLog(tuple(event_from_json(e) for e in doc["events"]))
    assert log.hang is not None and log.hang.report == live  # (the typed value, read back)


def test_the_end_of_a_run_takes_the_live_report_as_a_value_and_replay_reaches_the_same(tb):
    traces = tb.scenarios["hang_missing"]()
    live = _live(traces)
    events = (HangCalled(ACCOUNT, live.root_cause, {0: ("0", 4)}, live, at=1.0),
              Stopped(("SIGTERM",), at=2.0), Aftermath("rank 0 timed out", at=3.0))
    at_end = analyze(traces, annotators=(), watch=WatchLog(events))
    assert at_end.verdict is Verdict.HANG
    assert at_end.root_cause.same_call(_root()) and at_end.root_cause.ranks == (1,)
    assert at_end.stack_classes == live.stack_classes  # the live stacks, not recomputed
    # the captures alone name rank 1 missing from all_reduce #4 too (a desync)
    assert at_end.watchdog == replace(ACCOUNT, aftermath=("rank 0 timed out",),
                                      root_from_captures=True)
    assert "rank 0 timed out" in at_end.notes
    assert any("nccl-doctor stopped the job after diagnosing the hang (SIGTERM)" in n
               for n in at_end.notes)
    # replay: the same events through watchdog.json's text
    doc = json.loads(watch_record.watch_text(events))
    replayed = analyze(traces, annotators=(),
                       watch=WatchLog(tuple(event_from_json(e) for e in doc["events"])))
    assert replayed.to_json() == at_end.to_json()


def test_a_record_of_an_older_doctor_without_the_report_still_replays_the_hang(tb):
    """watchdog.json of version 1 written before the live report was kept: its root finding
    and account make the report."""
    traces = tb.scenarios["hang_missing"]()
    old = {"event": "hang", "at": 1.0, "watchdog": ACCOUNT.to_json(),
           "root": _root().to_json(), "stuck": {"0": ["0", 4]}}
    d = analyze(traces, annotators=(), watch=WatchLog((event_from_json(old),)))
    assert d.verdict is Verdict.HANG and d.root_cause.ranks == (1,)
    assert d.watchdog.how == "stuck_peer" and d.watchdog.waited_s == 0.0


def test_a_retracted_hang_leaves_the_post_mortem_alone(tb):
    traces = tb.scenarios["clean"]()
    events = (HangCalled(ACCOUNT, _root(), report=_live(traces), at=1.0), Retracted(at=2.0))
    assert analyze(traces, annotators=(), watch=WatchLog(events)) == analyze(traces,
                                                                              annotators=())


def test_the_account_writes_only_what_it_says():
    assert WatchAccount().to_json() == {} and not WatchAccount()
    assert ACCOUNT.to_json()["waited_s"] == 0.0  # a zero is said, not dropped
    assert WatchAccount.from_json(ACCOUNT.to_json()) == ACCOUNT
