"""What a notebook shows (issue "The edges users meet"): a ``Diagnosis``, a ``Finding`` and a
job print as one short line, display as report.html's own fragment - self-contained, its
stylesheet scoped, the job's text escaped - and ``calls.waited_s`` counts the calls a rank
never returned from up to the end of its capture."""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path

import html5lib
import numpy as np

import nccl_doctor
from nccl_doctor.capture import format as fmt
from nccl_doctor.capture.manifest import Manifest
from nccl_doctor.capture.writer import CaptureWriter
from nccl_doctor.data import columns
from nccl_doctor.diagnosis import Diagnosis, Finding, FindingKind, Severity, Verdict
from nccl_doctor.model import EventKind, EventState
from nccl_doctor.reporters.html import FRAGMENT_CLASS, fragment, scoped

EVIL = "<script>alert('owned')</script>\x1b]0;pwned\x07 <b onclick=x()>bold</b>"


def assert_fragment(text: str) -> object:
    """``text`` is one element, self-contained and scriptless: parsed, no script, nothing a
    browser would fetch, no event handler; its stylesheet styles only the element."""
    assert text.lstrip().startswith(f'<div class="{FRAGMENT_CLASS}">')
    assert "<html" not in text and "<body" not in text and "<!DOCTYPE" not in text
    lowered = text.lower()
    for fetch in ("http", "src=", "<script", "url(", "@import", "<link", "<iframe"):
        assert fetch not in lowered, fetch
    tree = html5lib.parse(text, namespaceHTMLElements=False)
    for el in tree.iter():
        assert el.tag != "script"
        assert not any(name.lower().startswith("on") for name in el.keys()), (el.tag, el.keys())
    style = next(el for el in tree.iter("style")).text
    rules = [rule.split("{")[0].strip() for rule in style.split("}") if rule.strip()]
    assert rules and all(sel.strip().startswith(f".{FRAGMENT_CLASS}")
                         for rule in rules for sel in rule.split(",")), rules
    return tree


def _finding(**changes) -> Finding:
    values = dict(kind=FindingKind.COLLECTIVE_MISMATCH, severity=Severity.ERROR,
                  title="all_reduce / broadcast #6 of group 0: ops differ " * 4,
                  detail="rank 1: all_reduce\n" * 200, ranks=tuple(range(0, 1024, 2)),
                  hint="Make the collective on every rank", group="0", seq=6,
                  op="all_reduce", callsite="/a/very/long/path/" * 8 + "train.py:15",
                  root_cause=True)
    values.update(changes)
    return Finding(**values)


def test_a_diagnosis_and_a_finding_print_as_one_short_line():
    root = _finding()
    other = _finding(kind=FindingKind.RANK_EXITED, root_cause=False, ranks=(3,),
                     title="rank 3 raised RuntimeError", callsite=None)
    d = Diagnosis(Verdict.HANG, (root, other), (), 1024)
    text = repr(d)
    assert "\n" not in text and len(text) <= 180, text
    assert text.startswith("<Diagnosis hang: all_reduce / broadcast #6 of group 0") and \
        text.endswith("train.py:15 - 2 findings, 1024 ranks>"), text
    for f, start in ((root, "<Finding error collective_mismatch (root cause) ranks 0,2,"),
                     (other, "<Finding error rank_exited rank 3: rank 3 raised RuntimeError>")):
        line = repr(f)
        assert "\n" not in line and len(line) <= 200 and line.startswith(start), line
    assert repr(Diagnosis(Verdict.OK, (), (), 2)) == "<Diagnosis ok - 0 findings, 2 ranks>"
    # the job's text is shown, never obeyed: no escape sequence reaches a terminal
    evil = repr(_finding(title=EVIL, callsite=EVIL + ".py:1"))
    assert "\x1b" not in evil and "\x07" not in evil and "\\x1b" in evil


def test_the_html_is_the_report_s_fragment_self_contained_and_escaped():
    root = _finding(title=EVIL, detail=EVIL, hint=EVIL, callsite=EVIL + ".py:3", ranks=(1,))
    d = Diagnosis(Verdict.HANG, (root,), (), 4, command=("python", EVIL))
    for text in (d._repr_html_(), root._repr_html_()):
        tree = assert_fragment(text)
        shown = " ".join(" ".join(el.itertext()) for el in tree.iter())
        assert "<script>alert('owned')</script>" in shown and "\\x1b]0;pwned\\x07" in shown
        assert "&lt;script&gt;" in text and "\x1b" not in text
        assert not any(el.tag == "b" for el in tree.iter())
        assert "collective_mismatch" in text and "Make the collective" not in text
    # the diagnosis' fragment is the report's content: what report.html says, in a <div>
    whole = d._repr_html_()
    assert "nccl-doctor report" in whole and 'id="findings"' in whole and "Ranks" in whole
    assert whole.count("finding sev-error") == 1
    assert root._repr_html_().count("finding sev-error") == 1


def test_the_stylesheet_is_scoped_to_the_fragment():
    css = "body { margin: 0; }\nmain { padding: 1px; }\nh1, .x::before { color: red; }\n"
    assert scoped(css, ".r") == (".r { margin: 0; }\n.r { padding: 1px; }\n"
                                 ".r h1, .r .x::before { color: red; }\n")
    assert fragment(Diagnosis(Verdict.OK, (), (), 2)).count("<style>") == 1


def test_a_job_prints_without_reading_its_captures(tmp_path, write_desync):
    out = write_desync(tmp_path, 4, culprit=1)
    job = nccl_doctor.open(out)
    assert repr(job) == f"<Job 4 ranks, {out}>"
    assert "calls" not in job.__dict__ and "traces" not in job.__dict__  # nothing read
    capture = sorted(out.glob(f"*{fmt.CAPTURE_SUFFIX}"))[0]
    lone = repr(nccl_doctor.open(capture))  # (no manifest: no ranks said)
    assert lone.startswith("<Job ") and lone.endswith(f"/desync4/{capture.name}>"), lone
    assert len(lone) <= 106 and "ranks" not in lone
    d = job.diagnose()
    assert repr(d).startswith(f"<Diagnosis {d.verdict.value}: all_gather / all_reduce #12") \
        and len(repr(d)) <= 180, repr(d)
    text = job._repr_html_()  # displayed: diagnosed, the timeline drawn
    assert_fragment(text)
    assert "<svg" in text and 'id="timeline"' in text and d.root_cause is not None


def _capture(out: Path, rank: int, t0: int, hung_at: int,
             note_exit_ns: int | None = None) -> None:
    """Rank ``rank`` all_reduces 3 times from ``t0`` (the writer stamps each exit now);
    ``hung_at``: the call (1-3) it never returns from; ``note_exit_ns``: its interpreter's
    exit, as the recorder notes it."""
    w = CaptureWriter(out / f"rank{rank:05d}.node0.{100 + rank}{fmt.CAPTURE_SUFFIX}",
                      {"rank": rank, "world_size": 2, "host": "node0", "pid": 100 + rank,
                       "started_ns": t0}, capacity=64, strtab_bytes=4096)
    w.note("group", name="0", ranks=[0, 1], backend="gloo", time_ns=t0)
    site = w.intern("/job/train.py")
    for i in range(1, 4):
        idx = w.begin((0, t0 + i * 10_000_000, i, 4, 1, w.intern("all_reduce"), w.intern("0"),
                       w.intern("float32[1]"), 0, site, 9, w.intern("step"), site, 9, 0, -1,
                       2, 0, int(EventKind.COLLECTIVE), 0, 0))
        if i == hung_at:
            break
        w.end(idx, int(EventState.RETURNED), 1)
    if note_exit_ns is not None:
        w.note("exit", time_ns=note_exit_ns)


def test_waited_counts_a_call_never_returned_up_to_the_job_s_end(tmp_path):
    out = tmp_path / "run"
    out.mkdir()
    now = time.time_ns()
    t0 = now - 1_000_000_000
    _capture(out, 0, t0, hung_at=3)  # blocked in its third all_reduce until the job ended
    _capture(out, 1, t0, hung_at=2, note_exit_ns=now + 5_000_000_000)  # its exit noted
    ended = (now + 9_000_000_000) / 1e9
    Manifest(command=("python", "train.py"), started_at=t0 / 1e9, run_id="w", world_size=2,
             ended_at=ended, exit_status=1).write(out)
    calls = nccl_doctor.open(out).calls
    assert list(calls.columns) == list(columns.COLUMNS)
    hung = calls[calls["state"] == "entered"].set_index("rank")
    assert hung["duration_s"].isna().all() and hung["t_exit"].isna().all()
    # rank 0 records no exit: up to the job's end (the manifest's); rank 1 up to its own exit
    entered = hung["t_enter"].map(lambda t: t.value)
    assert abs(hung.loc[0, "waited_s"] - (round(ended * 1e9) - entered[0]) / 1e9) < 1e-6
    assert hung.loc[1, "waited_s"] == (now + 5_000_000_000 - entered[1]) / 1e9
    done = calls[calls["state"] == "returned"]
    assert np.array_equal(done["waited_s"].to_numpy(), done["duration_s"].to_numpy())
    # the question the column answers: each rank's time in collectives, the hang included
    per_rank = calls.groupby(["rank", "op"], observed=True)["waited_s"].sum()
    assert per_rank.loc[(0, "all_reduce")] > 8.9 and per_rank.loc[(1, "all_reduce")] > 4.9
    assert calls.groupby("rank")["duration_s"].sum().max() < 4
    # one rank's capture file: its run's end still
    one = sorted(out.glob(f"rank00000*{fmt.CAPTURE_SUFFIX}"))[0]
    alone = nccl_doctor.open(one).calls
    assert alone["waited_s"].tolist() == calls.loc[calls["rank"] == 0, "waited_s"].tolist()
    # a capture away from its run: no job end known - up to its last record (the second
    # call's exit)
    (tmp_path / "elsewhere").mkdir()
    lone = nccl_doctor.open(shutil.copy(one, tmp_path / "elsewhere")).calls
    last = lone["t_exit"].max().value
    assert lone.loc[lone["state"] == "entered", "waited_s"].tolist() == [
        (last - entered[0]) / 1e9]
    # exported too
    csv = tmp_path / "calls.csv"
    from nccl_doctor.data import export
    export.write(nccl_doctor.open(out).iter_calls(), csv, "csv")
    assert csv.read_text().splitlines()[0].split(",")[16:18] == ["duration_s", "waited_s"]


def test_rank_end():
    assert columns.rank_end(100, None) == 100
    assert columns.rank_end(100, None, (90, 200, 150)) == 150  # the first after its last record
    assert columns.rank_end(100, 120, (500,)) == 120  # its own exit, where recorded
    assert columns.rank_end(100, 80, (500,)) == 100  # never before its last record
    assert columns.exit_time([{"note": "exit", "time_ns": 7}, {"note": "x", "time_ns": 9},
                              {"note": "exception", "time_ns": 5}]) == (5, 9)
    assert columns.exit_time([{"note": "group"}]) == (None, 0)
    assert json.dumps(columns.COLUMNS["waited_s"])
