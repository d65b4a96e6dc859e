"""Every reporter renders every scenario's diagnosis; the JSON report keeps its schema."""

from __future__ import annotations

import io
import json
from pathlib import Path

import html5lib
import pytest

from nccl_doctor.analysis import analyze
from nccl_doctor.analysis.calls.loaded import load_capture_dir
from nccl_doctor.model import EventKind, EventState
from nccl_doctor.watch_account import WatchAccount
from nccl_doctor.capture.writer import CaptureWriter
from nccl_doctor.diagnosis import SCHEMA_VERSION, Verdict
from nccl_doctor.errors import UsageError
from nccl_doctor.reporters import REPORTERS, format_for, get_reporter
from nccl_doctor.analysis.page_builder import page as page_of

RANK_KEYS = {"rank", "host", "pid", "state", "exit_code", "signal", "last_collective",
             "stack_summary"}
FINDING_KEYS = {"kind", "severity", "ranks", "group", "seq", "op", "callsite", "title", "detail",
                "hint", "evidence"}


def render(name: str, diagnosis, *, color: bool = False) -> str:
    out = io.StringIO()
    get_reporter(name).render(diagnosis, out, color=color)
    return out.getvalue()


def squash(text: str) -> str:
    """Whitespace-normalised text (the console wraps long lines at its width)."""
    return " ".join(text.split())


def test_the_three_reporters_are_registered() -> None:
    assert sorted(REPORTERS) == ["console", "html", "json"]


@pytest.mark.parametrize("name", sorted(REPORTERS))
@pytest.mark.parametrize("color", [False, True])
def test_every_reporter_renders_every_scenario(scenario, name, color) -> None:
    _label, ts = scenario
    d = analyze(ts)
    text = render(name, d, color=color)
    if name == "json":
        assert json.loads(text)["verdict"] == d.verdict.value
    elif name == "html":
        out = io.StringIO()
        get_reporter(name, page_of(ts, d)).render(d, out)  # with the timeline drawn
        for page in (text, out.getvalue()):
            body = " ".join(" ".join(e.itertext()) for e in html5lib.parse(
                page, namespaceHTMLElements=False).iter("body"))
            assert f"nccl-doctor report {d.verdict.value}" in " ".join(body.split())
            for f in d.findings:
                assert f.kind.value in body
    else:
        assert f"nccl-doctor: {d.verdict.value.upper()}" in text
        for f in d.findings:
            assert f.kind.value in text


def test_json_report_schema(scenario) -> None:
    label, ts = scenario
    d = analyze(ts)
    report = json.loads(render("json", d))
    assert report["schema_version"] == SCHEMA_VERSION == 1
    assert report["verdict"] == d.verdict.value
    assert report["verdict"] in {v.value for v in Verdict}
    assert report["world_size"] == ts.world_size
    assert isinstance(report["ranks"], list) and isinstance(report["findings"], list)
    assert [r["rank"] for r in report["ranks"]] == list(range(ts.world_size))
    for r in report["ranks"]:
        assert RANK_KEYS <= set(r), label
        assert isinstance(r["state"], str) and isinstance(r["pid"], int)
        if r["last_collective"] is not None:
            assert {"group", "seq", "op", "state", "callsite"} <= set(r["last_collective"])
    assert len(report["findings"]) == len(d.findings)
    for f in report["findings"]:
        assert FINDING_KEYS <= set(f), label
        assert isinstance(f["ranks"], list) and all(isinstance(x, int) for x in f["ranks"])
        assert isinstance(f["evidence"], dict)
        assert isinstance(f["title"], str) and f["title"]
    if d.findings:
        assert report["findings"][0]["root_cause"] is True
        assert sum(f["root_cause"] for f in report["findings"]) == 1


def test_json_report_of_the_shape_mismatch(tb) -> None:
    report = json.loads(render("json", analyze(tb.scenarios["shape_mismatch"]())))
    assert report["verdict"] == "crash" and report["world_size"] == 2
    (f,) = report["findings"]
    assert f["kind"] == "collective_mismatch" and f["severity"] == "error"
    assert f["ranks"] == [1] and f["group"] == "0" and f["seq"] == 3 and f["op"] == "all_gather"
    assert f["callsite"] == "/job/train.py:40"
    assert f["evidence"]["aspect"] == "shape"
    r0 = report["ranks"][0]
    assert r0["state"] == "exception" and r0["exit_code"] == 1 and r0["signal"] is None
    assert r0["host"] == "node0" and r0["pid"] == 1000
    assert r0["last_collective"]["op"] == "all_gather" and r0["last_collective"]["seq"] == 3
    assert r0["last_collective"]["state"] == "failed"
    assert r0["stack_summary"] is None
    assert report["groups"] == {"0": [0, 1]}


def test_json_report_of_a_missing_rank(tb) -> None:
    report = json.loads(render("json", analyze(tb.scenarios["no_capture"]())))
    assert report["verdict"] == "hang"
    r2 = report["ranks"][2]
    assert r2["state"] == "no_capture" and r2["last_collective"] is None and r2["pid"] == 0


@pytest.mark.parametrize("name", ["shape_mismatch", "rank_exited_early", "hang_missing",
                                  "no_capture"])
def test_console_shows_the_root_cause(tb, name) -> None:
    d = analyze(tb.scenarios[name]())
    text = render("console", d)
    root = d.root_cause
    assert root is not None
    assert "ROOT CAUSE" in text
    assert squash(root.title) in squash(text)
    assert squash(root.hint) in squash(text)
    assert f"nccl-doctor: {d.verdict.value.upper()}" in text
    for r in d.ranks:
        assert f"\n{r.rank} " in text or f"\n {r.rank} " in text  # one table row per rank


def test_console_keeps_brackets_literal(tb) -> None:
    """Tensor shapes look like rich markup ([2,7,32]): they must be printed, not eaten."""
    text = render("console", analyze(tb.scenarios["shape_mismatch"]()))
    assert "float32[2,7,32]" in text and "float32[2,9,32]" in text


def test_console_ok_and_notes(tb) -> None:
    text = render("console", analyze(tb.scenarios["clean"]()))
    assert "nccl-doctor: OK" in text and "no problem found" in text
    assert "ROOT CAUSE" not in text
    text = render("console", analyze(tb.scenarios["empty"]()))
    assert "NOT_RECORDED" in text and "no rank was recorded" in text
    assert "no rank joined a process group" in text
    assert "(0 ranks)" in text


def test_console_without_color_has_no_escape_codes(tb) -> None:
    d = analyze(tb.scenarios["shape_mismatch"]())
    assert "\x1b[" not in render("console", d, color=False)
    assert "\x1b[" in render("console", d, color=True)


def test_report_from_real_capture_files(tmp_path: Path) -> None:
    """Writer -> reader -> analysis -> both reporters, on a 2-rank shape mismatch."""
    for rank, length in ((0, 7), (1, 9)):
        w = CaptureWriter(tmp_path / f"rank{rank:05d}.node0.{10 + rank}.ndcap",
                          {"rank": rank, "world_size": 2, "host": "node0", "pid": 10 + rank})
        w.note("group", name="0", ranks=[0, 1], backend="gloo")
        ar, ag, grp = w.intern("all_reduce"), w.intern("all_gather"), w.intern("0")
        f4, shape = w.intern("float32[4]"), w.intern(f"float32[2,{length},32]")
        src, fn = w.intern("/job/train.py"), w.intern("step")
        for seq in (1, 2):
            idx = w.begin((0, seq, seq, 16, 1, ar, grp, f4, 0, src, 20, fn, src, 20, 0, -1, 2, 0,
                           int(EventKind.COLLECTIVE), 0, 0))
            w.end(idx, int(EventState.RETURNED), 1)
        idx = w.begin((0, 3, 3, 16, 1, ag, grp, shape, 0, src, 40, fn, src, 40, 0, -1, 2, 0,
                       int(EventKind.COLLECTIVE), 0, 0))
        w.end(idx, int(EventState.FAILED), 1)
        w.note("exception", type="RuntimeError", message="Connection closed by peer",
               path="/job/train.py", line=40, function="step")
    d = analyze(load_capture_dir(tmp_path, job_ended=True))
    assert d.verdict is Verdict.CRASH
    assert d.root_cause.kind.value == "collective_mismatch"
    report = json.loads(render("json", d))
    assert report["findings"][0]["evidence"]["aspect"] == "shape"
    assert report["ranks"][1]["capture"]["file"] == "rank00001.node0.11.ndcap"
    assert report["ranks"][1]["capture"]["complete"] is True
    text = render("console", d)
    assert squash(d.root_cause.title) in squash(text)


def test_format_for_and_get_reporter(tmp_path: Path) -> None:
    assert format_for(None, None) == "console"
    assert format_for(tmp_path / "report.json", None) == "json"
    assert format_for(tmp_path / "REPORT.JSON", None) == "json"
    assert format_for(tmp_path / "report.txt", None) == "console"
    assert format_for(tmp_path / "report.out", "json") == "json"  # an extension naming none
    assert format_for(tmp_path / "report.log", "console") == "console"
    with pytest.raises(UsageError, match=r"report.json: its extension names the json format, "
                                         r"not --format console: end the file in \.txt or "
                                         r"\.log"):
        format_for(tmp_path / "report.json", "console")
    with pytest.raises(UsageError, match="console, html, json"):
        get_reporter("pdf")


def test_live_hang_report_shows_stack_classes_and_the_watchdog() -> None:
    from dataclasses import replace

    from nccl_doctor.diagnosis import Diagnosis, RankSummary
    from nccl_doctor.sections import StackClass

    ranks = tuple(
        RankSummary(rank=r, host="h", pid=100 + r, state="blocked", exit_code=None, signal=None,
                    exit_detail="blocked", last_collective=None, capture=None,
                    stack_summary=f"train.py:{30 + r} in step [py-spy]")
        for r in range(3)
    )
    d = Diagnosis(verdict=Verdict.HANG, findings=(), ranks=ranks, world_size=3,
                  stack_classes=(StackClass(ranks=(0, 2), odd=False, sources=("py-spy",),
                                            frames=("train.py:50 main", "train.py:30 step")),
                                 StackClass(ranks=(1,), odd=True, sources=("agent",),
                                            frames=("train.py:50 main", "data.py:9 load"))),
                  watchdog=WatchAccount(situation="deadlock", waited_s=2.4,
                                        action="stopped the job"))
    text = squash(render("console", d))
    assert "ranks 0, 2: train.py:50 main -> train.py:30 step (py-spy)" in text
    assert "rank 1: train.py:50 main -> data.py:9 load (agent) <- odd one out" in text
    assert "watchdog: deadlock diagnosed 2.4 s after the last progress; stopped the job" in text
    assert "train.py:31 in step [py-spy]" in text
    report = json.loads(render("json", d))
    assert report["stack_classes"][1]["odd"] is True
    assert report["watchdog"]["situation"] == "deadlock"
    assert json.loads(render("json", replace(d, stack_classes=(), watchdog=WatchAccount())))["watchdog"] == {}


def test_every_reporter_names_the_issuing_line_the_users_line_and_the_path(tb) -> None:
    """A call a library made: the finding's callsite is the library's line, its entry the
    user's, and its path every frame between; the console, JSON, HTML and the pytest plugin's
    failure text all carry them."""
    from dataclasses import replace

    from nccl_doctor.location import Location
    from nccl_doctor.testing.launches import describe

    site = "/v/lib/python3.11/site-packages/"
    path = (Location(site + "accelerate/utils/operations.py", 380, "gather"),
            Location(site + "trl/trainer/cpo_trainer.py", 839, "get_batch_loss_metrics"),
            Location("/job/train.py", 16, "main"))
    base = tb.scenarios["shape_mismatch"]()
    traces = replace(base, ranks={r: replace(
        t, meta=replace(t.meta, versions={"trl": "0.16.1"}),
        events=tuple(replace(e, callsite=path[-1], api_callsite=path[0], path=path)
                     for e in t.events)) for r, t in base.ranks.items()})
    d = analyze(traces)
    root = d.root_cause
    assert root.callsite.endswith("trl/trainer/cpo_trainer.py:839")
    assert root.entry_callsite == "/job/train.py:16"
    assert [f.version for f in root.call_path] == [None, "0.16.1", None]
    assert "get_batch_loss_metrics (trl 0.16.1) <- your /job/train.py:16" in root.detail
    console = render("console", d)
    assert "call path:" in console and "(from /job/train.py:16)" in console
    assert "<- trl/trainer/cpo_trainer.py:839 in " in console
    report = json.loads(render("json", d))
    first = report["findings"][0]
    assert first["entry_callsite"] == "/job/train.py:16" and len(first["call_path"]) == 3
    page = render("html", d)
    assert "call path" in page and "(from /job/train.py:16)" in page
    text = describe({**report, "_capture": "/caps"})
    assert "(from /job/train.py:16)" in text and "get_batch_loss_metrics (trl 0.16.1)" in text
