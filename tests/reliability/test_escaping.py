"""Terminal injection: text that came from the job (an exception's message, a host name) or from a
capture file reaches the user's terminal with its control characters shown, never sent; rich
markup in it is printed as written; report.json keeps it as it was."""

from __future__ import annotations

import io
import json
import re
from pathlib import Path

import html5lib
import pytest

from nccl_doctor import env
from nccl_doctor.cli.status_bar import PlainStatus, StatusBar
from nccl_doctor.diagnosis import Diagnosis, Verdict
from nccl_doctor.status_view import LiveView, RankState, RankView
from nccl_doctor.reporters import status_line
from nccl_doctor.reporters.console import ConsoleReporter
from nccl_doctor.reporters.escape import visible

from .conftest import doctor, os, spawn

pytestmark = pytest.mark.integration

JOB = Path(__file__).parent / "jobs" / "escapes.py"
HOST = "node\x1b[5m7"  # the ranks' host name (NCCL_DOCTOR_HOSTNAME), a capture file's word too
RAW = ("\x1b", "\x07", "\x9b")  # ESC, BEL, C1 CSI: none may reach the terminal
SHOWN = r"\x1b]0;pwned\x07\x1b[31m"  # the exception's OSC and CSI, as the reports show them


def assert_no_control(text: str) -> None:
    found = sorted({c for c in text if c in RAW})
    assert not found, f"raw control characters {found!r} in:\n{text[-3000:]!r}"


@pytest.fixture(scope="module")
def injected(tmp_path_factory) -> tuple[Path, str]:
    """A 2-rank gloo job whose rank 1 raised the exception, run under the doctor; (out, output)."""
    out = tmp_path_factory.mktemp("escapes") / "out"
    proc = doctor("run", "--out", str(out), "--", *spawn(2, JOB),
                  env={**os.environ, env.HOSTNAME: HOST})
    assert proc.returncode == 1, proc.stderr[-3000:]
    return out, proc.stdout + proc.stderr


def test_run_shows_the_job_s_control_characters_instead_of_sending_them(injected):
    _out, output = injected
    assert_no_control(output)
    assert SHOWN in output  # the escaped form is there, readable
    assert r"\x9b2J" in output
    assert "[bold]not" in output  # rich markup in the message is printed, not interpreted
    assert r"node\x1b[5m7" in output  # the host name in the ranks table


def test_replay_of_that_capture_shows_them_too(injected):
    out, _output = injected
    proc = doctor("replay", str(out))
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert_no_control(proc.stdout + proc.stderr)
    assert SHOWN in proc.stdout and r"node\x1b[5m7" in proc.stdout
    assert "[bold]not" in proc.stdout


def test_json_keeps_the_text_as_the_job_wrote_it(injected):
    out, _output = injected
    proc = doctor("replay", "--format", "json", str(out))
    assert_no_control(proc.stdout)  # JSON escapes them itself (\u001b)
    report = json.loads(proc.stdout)
    rank1 = next(r for r in report["ranks"] if r["rank"] == 1)
    assert "\x1b]0;pwned\x07\x1b[31m" in rank1["exit_detail"]
    assert rank1["host"] == HOST
    saved = json.loads((out / "report.json").read_text())
    assert saved["ranks"] == report["ranks"]


def test_the_page_run_wrote_shows_the_job_text_as_text(injected):
    out, _output = injected
    page = (out / "report.html").read_text()
    tree = html5lib.parse(page, namespaceHTMLElements=False)
    shown = " ".join(" ".join(el.itertext()) for el in tree.iter("body"))
    assert SHOWN in shown and "[bold]not markup[/bold]" in shown
    assert "\x1b" not in page and "\x07" not in page
    assert r"node\x1b[5m7" in shown


def test_a_callsite_named_like_a_script_tag_is_text_on_the_page(tmp_path):
    """A real job run from ``<script>alert(1)</script>.py`` (a directory ``<script>alert(1)<``
    holding ``script>.py``): its callsite is shown as written, never run."""
    folder = tmp_path / "<script>alert(1)<"
    folder.mkdir()
    job = folder / "script>.py"
    job.write_text(JOB.read_text())
    out = tmp_path / "out"
    proc = doctor("run", "--out", str(out), "--", *spawn(2, job))
    assert proc.returncode == 1, proc.stderr[-3000:]
    page = (out / "report.html").read_text()
    tree = html5lib.parse(page, namespaceHTMLElements=False)
    assert not list(tree.iter("script")), "a script element came from the job's path"
    assert "<script>alert(1)</script>" not in page
    shown = " ".join(" ".join(el.itertext()) for el in tree.iter("body"))
    assert "<script>alert(1)</script>.py:" in shown  # the callsite, as text


def test_an_error_line_shows_the_control_characters_of_the_path_it_quotes(tmp_path):
    proc = doctor("replay", str(tmp_path / "no\x1b]0;pwned\x07here"))
    assert proc.returncode != 0
    assert_no_control(proc.stderr)
    assert r"no\x1b]0;pwned\x07here" in proc.stderr


# --- the renderers alone: the live status, and a finding's multi-line detail ------------------

def test_live_status_lines_and_announcements_show_control_characters():
    ranks = (RankView(0, "h", 3, RankState.WAITING), RankView(1, "h", 2, RankState.AWAITED))
    view = LiveView(ranks=ranks, phase="hang", message="rank 1 at job\x1b[2J.py:3", quiet_s=0,
                    elapsed_s=5)
    plain = io.StringIO()
    status = PlainStatus(plain, lambda: view)
    status()
    status.announce("HANG: rank 1 raised E: \x1b]0;x\x07")
    assert_no_control(plain.getvalue())
    assert r"job\x1b[2J.py:3" in plain.getvalue() and r"\x1b]0;x\x07" in plain.getvalue()
    row = status_line.ansi(status_line.bar(view), 200)
    assert "\x1b[2J" not in row and r"job\x1b[2J.py:3" in row  # the bar's own colours stay
    bar = io.StringIO()
    StatusBar(bar, lambda: view).announce("HANG: E: \x9b2J\x1b]0;x\x07")
    assert "\x9b" not in bar.getvalue() and "\x07" not in bar.getvalue()
    assert r"\x9b2J\x1b]0;x\x07" in bar.getvalue()


@pytest.mark.parametrize("color", [False, True])
def test_console_report_of_a_capture_file_s_text(color):
    text = "raised E: \x1b]0;t\x07 [red]x[/red]\r\x9b1A"
    diagnosis = Diagnosis.from_json({
        "verdict": Verdict.CRASH.value, "world_size": 1, "exit_status": 1,
        "findings": [{"kind": "rank_exited", "severity": "error", "title": text,
                      "detail": f"line one {text}\nline two \x1b[1A", "ranks": [0],
                      "hint": "", "callsite": "job\x1b[8m.py:3", "root_cause": True}],
        "ranks": [{"rank": 0, "host": "h\x1b[5m", "pid": 1, "state": "exception",
                   "exit_detail": text, "stack_summary": "job.py:3 in f\x07 [py-spy]"}],
        "notes": ["note \x1b]8;;http://x\x07link"],
        "stack_classes": [{"ranks": [0], "odd": False, "frames": ["job\x1b[8m.py:3 f"],
                           "sources": ["py-spy\x07"]}],
        "watchdog": {"situation": "stuck\x1b[1A", "waited_s": 3, "action": "stopped"},
    })
    buffer = io.StringIO()
    ConsoleReporter().render(diagnosis, buffer, color=color)
    shown = buffer.getvalue()
    if color:  # the reporter's own styles are SGR sequences (none of the job's): take them out
        assert "\x1b[5m" not in shown and "\x1b[8m" not in shown
        shown = re.sub("\x1b\\[[0-9;]*m", "", shown)
    assert_no_control(shown)
    assert "\r" not in shown
    assert r"\x1b]0;t\x07" in shown and r"\x9b1A" in shown and r"\x0d" in shown
    assert "[red]x[/red]" in shown
    assert "line two " in shown and r"\x1b[1A" in shown  # the detail keeps its lines
    assert r"h\x1b[5m" in shown and r"job\x1b[8m.py:3" in shown
    assert r"py-spy\x07" in shown and r"stuck\x1b[1A" in shown  # a stack class, the watchdog


def test_visible():
    # C0 but tab, DEL, C1; not a no-break space nor any other printable character
    assert visible("a\tb\x00\x1b\x7f\x80\x9f\xa0é") == "a\tb" + r"\x00\x1b\x7f\x80\x9f" + "\xa0é"
    assert visible("one\ntwo") == r"one\x0atwo"
    assert visible("one\ntwo\r", newlines=True) == "one\ntwo\\x0d"
