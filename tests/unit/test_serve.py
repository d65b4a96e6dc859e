"""``run --serve``'s parts that need no job: the address, what one published look draws (the
page, escaped; the metrics), the hang's state held to the exit, the endpoint over real HTTP on
loopback and the linger it ends once the final report is read, and docs/serve.md showing the
example Prometheus files as they are."""

from __future__ import annotations

import io
import json
import re
import socket
import sys
import threading
import time
import urllib.error
import urllib.request
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace

import pytest
from prometheus_client.parser import text_string_to_metric_families

from nccl_doctor.analysis import analyze
from nccl_doctor.cli.main import main
from nccl_doctor.cli.serving import Serving
from nccl_doctor.diagnosis import Verdict
from nccl_doctor.errors import ExitStatus, UsageError
from nccl_doctor.status_view import LiveView, RankState, RankView
from nccl_doctor.serve import live_page, metrics
from nccl_doctor.serve.publisher import Publisher
from nccl_doctor.serve.server import CONCURRENT, Endpoint, parse_address
from nccl_doctor.serve.state import Published

HOSTILE = "<script>alert('x')</script>&\"q\""
ROOT = Path(__file__).resolve().parents[2]


def _hang(tb):
    traces = tb.traceset(
        [tb.trace(0, tb.collectives(4, group_size=2, last_state=tb.ENTERED), world_size=2),
         tb.trace(1, tb.collectives(3, group_size=2), world_size=2)], groups={"0": (0, 1)},
        world_size=2)
    d = analyze(traces, annotators=())
    assert d.root_cause is not None and d.root_cause.ranks == (1,)
    return d


def _published(tb, **kw) -> Published:
    report = _hang(tb)
    view = LiveView((RankView(0, "nodeA", 4, RankState.WAITING, "all_reduce #4 (group 0)"),
                     RankView(1, "nodeA", 3, RankState.AWAITED)), "waiting_on_peers",
                    "rank 1 awaited", 7.5, 20.0)
    return Published(at=1.7e9, state="running", view=view, since_progress={0: 7.5, 1: 9.0},
                     report=report, report_json=report.to_json_text(), nodes={"joined": 1},
                     skew_s={1: 0.25}, **kw)


@pytest.mark.parametrize("text, want", [("9400", ("127.0.0.1", 9400)),
                                        ("0.0.0.0:9400", ("0.0.0.0", 9400)),
                                        ("[::1]:0", ("::1", 0)), (":81", ("127.0.0.1", 81))])
def test_an_address_defaults_to_loopback(text, want):
    assert parse_address(text) == want


@pytest.mark.parametrize("text, said", [("", "[HOST:]PORT"), ("host:", "[HOST:]PORT"),
                                        ("host:http", "[HOST:]PORT"), ("70000", "[HOST:]PORT"),
                                        ("-1", "[HOST:]PORT"), ("::1:80", "in brackets")])
def test_a_bad_address_says_what_to_write(text, said):
    with pytest.raises(ValueError, match=re.escape(said)):
        parse_address(text)


def test_run_refuses_a_bad_or_taken_address_before_touching_anything(tmp_path, capsys):
    """One line and exit 2, before --out is prepared: an earlier run's files stay."""
    out = tmp_path / "out"
    out.mkdir()
    (out / "manifest.json").write_text("{}")
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        port = taken.getsockname()[1]
        for address, said in ((f"127.0.0.1:{port}", "cannot listen there"),
                              ("nowhere:port", "give [HOST:]PORT")):
            with pytest.raises(SystemExit) as exited:
                status = main(["run", "--serve", address, "--force", "--out", str(out),
                               "--", sys.executable, "-c", "pass"])
                raise SystemExit(status)
            assert exited.value.code == ExitStatus.USAGE
            lines = capsys.readouterr().err.strip().splitlines()
            assert len(lines) == 1 and said in lines[0], lines
    assert (out / "manifest.json").read_text() == "{}"


def test_the_metrics_say_the_phase_verdict_culprit_and_ranks(tb):
    pub = _published(tb)
    families = {f.name: f for f in text_string_to_metric_families(metrics.render(pub).decode())}
    samples = {(s.name, tuple(sorted(s.labels.items()))): s.value
               for f in families.values() for s in f.samples}
    assert samples[("nccl_doctor_phase", (("phase", "hang"),))] == 1
    assert samples[("nccl_doctor_verdict", (("verdict", "hang"),))] == 1
    cause = [s for f in families.values() for s in f.samples if s.name == "nccl_doctor_root_cause"]
    assert [(s.labels["rank"], s.labels["host"], s.labels["kind"]) for s in cause] == [
        ("1", "nodeA", pub.report.root_cause.kind.value)]
    assert samples[("nccl_doctor_rank_calls_total", (("host", "nodeA"), ("rank", "0")))] == 4
    assert samples[("nccl_doctor_rank_state", (("host", "nodeA"), ("rank", "1"),
                                               ("state", "awaited")))] == 1
    assert samples[("nccl_doctor_rank_seconds_since_progress",
                    (("host", "nodeA"), ("rank", "1")))] == 9.0
    assert samples[("nccl_doctor_straggler_skew_seconds", (("rank", "1"),))] == 0.25
    assert samples[("nccl_doctor_quiet_seconds", ())] == 7.5
    kinds = {s.labels["kind"]: s.value for s in families["nccl_doctor_findings"].samples}
    assert kinds == {k: sum(f.kind.value == k for f in pub.report.findings) for k in kinds}
    # before any report: running, verdict none, no culprit
    early = replace(pub, report=None, report_json="")
    text = metrics.render(early).decode()
    assert 'nccl_doctor_phase{phase="waiting_on_peers"} 1.0' in text
    assert 'nccl_doctor_verdict{verdict="none"} 1.0' in text
    assert "nccl_doctor_root_cause{" not in text


def test_the_page_escapes_what_the_job_wrote(tb):
    pub = _published(tb)
    cause = replace(pub.report.root_cause, title=f"title {HOSTILE}", callsite=f"{HOSTILE}:3",
                    hint=HOSTILE)
    report = replace(pub.report, findings=(cause,))
    view = replace(pub.view, message=HOSTILE, ranks=(
        RankView(0, HOSTILE, 4, RankState.WAITING, HOSTILE),))
    text = live_page.render(replace(pub, report=report, view=view))
    assert "<script" not in text and "alert('x')" not in text
    assert text.count("&lt;script&gt;") >= 5
    assert '<h1 id="verdict">HANG</h1>' in text and '<b id="culprit">1</b>' in text
    assert 'http-equiv="refresh"' in text and "<b>" not in text.replace("<b id=", "")
    # metrics keep the text as label values, escaped by the exposition format
    hostile = replace(pub, report=report, view=view)
    parsed = list(text_string_to_metric_families(metrics.render(hostile).decode()))
    hosts = {s.labels.get("host") for f in parsed for s in f.samples if "host" in s.labels}
    assert HOSTILE in hosts


def _get(url: str, method: str = "GET") -> tuple[int, bytes, dict]:
    req = urllib.request.Request(url, method=method)
    try:
        with urllib.request.urlopen(req, timeout=10) as r:
            return r.status, r.read(), dict(r.headers)
    except urllib.error.HTTPError as err:
        return err.code, err.read(), dict(err.headers)


def test_the_endpoint_answers_from_the_newest_look(tb):
    looks = [Published(at=1.7e9, state="starting", view=None)]
    endpoint = Endpoint("127.0.0.1", 0, lambda: looks[-1])
    try:
        base = endpoint.url
        status, body, _ = _get(base + "report.json")
        assert status == 404 and b"no report yet" in body
        status, body, headers = _get(base)
        assert status == 200 and b"STARTING" in body
        assert headers["Content-Security-Policy"].startswith("default-src 'none'")
        looks.append(_published(tb, report_html="<html>the report</html>"))
        status, body, _ = _get(base + "report.json")
        assert status == 200 and body.decode() == looks[-1].report_json
        assert _get(base + "report.html")[1] == b"<html>the report</html>"
        status, body, headers = _get(base + "metrics")
        assert status == 200 and headers["Content-Type"].startswith("text/plain; version=0.0.4")
        assert b'nccl_doctor_phase{phase="hang"} 1.0' in body
        status, body, _ = _get(base + "status.json?x=1")
        assert status == 200 and json.loads(body)["root_cause"]["ranks"] == [1]
        assert _get(base + "nope")[0] == 404
        status, body, _ = _get(base + "metrics", "HEAD")
        assert status == 200 and body == b""
        assert _get(base + "metrics", "POST")[0] == 501
        # as many connections as it serves at once, saying nothing (slow clients): one more
        # is answered 503 at once, never queued behind them; once they go, it is served
        idle = [socket.create_connection(("127.0.0.1", endpoint.port)) for _ in range(CONCURRENT)]
        try:
            deadline = time.monotonic() + 10
            while _get(base + "metrics")[0] != 503:
                assert time.monotonic() < deadline, "never busy"
                time.sleep(0.05)
        finally:
            for conn in idle:
                conn.close()
        deadline = time.monotonic() + 10
        while _get(base + "metrics")[0] != 200:
            assert time.monotonic() < deadline, "busy after the clients left"
            time.sleep(0.05)
    finally:
        endpoint.close()
    assert not any(t.name == "nccl-doctor-serve" and t.is_alive() for t in threading.enumerate())


def test_a_taken_port_is_one_usage_line():
    first = Endpoint("127.0.0.1", 0, lambda: Published(at=0.0, state="starting", view=None))
    try:
        with pytest.raises(UsageError, match=f"--serve 127.0.0.1:{first.port}: cannot listen "
                                             "there .*choose another port"):
            Endpoint("127.0.0.1", first.port, lambda: Published(at=0.0, state="x", view=None))
    finally:
        first.close()


def _samples(pub: Published) -> dict:
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for f in text_string_to_metric_families(metrics.render(pub).decode())
            for s in f.samples}


def test_a_hang_stays_up_until_the_process_exits(tb):
    """From the call on, ``hang_detected`` is 1 and the phase ``hang`` - through the stop, the
    analysis and the final look (the linger): the run's state says what nccl-doctor does."""
    pub = _published(tb)
    for state in ("running", "ended", "analysing", "done"):
        look = _samples(replace(pub, state=state, hung=state != "running"))
        assert look[("nccl_doctor_hang_detected", ())] == 1, state
        assert look[("nccl_doctor_phase", (("phase", "hang"),))] == 1, state
        assert look[("nccl_doctor_run_state", (("state", state),))] == 1, state
        assert [k for k in look if k[0] == "nccl_doctor_phase"] == [
            ("nccl_doctor_phase", (("phase", "hang"),))]
    final = replace(pub, state="done")
    assert final.status()["phase"] == "hang" and final.status()["state"] == "done"
    assert final.status()["hang_detected"] is True
    # a hang that stood when the job ended, whatever the final report says
    crashed = replace(pub.report, verdict=Verdict.CRASH)
    view = replace(pub.view, phase="ended")
    assert _samples(replace(pub, state="done", report=crashed, view=view, hung=True))[
        ("nccl_doctor_hang_detected", ())] == 1
    # none called, or progress retracted it (the report says suspect): 0, the phase is the job's
    retracted = replace(pub.report, verdict=Verdict.SUSPECT)
    for look in (replace(pub, report=None, report_json=""), replace(pub, report=retracted)):
        got = _samples(look)
        assert got[("nccl_doctor_hang_detected", ())] == 0
        assert got[("nccl_doctor_phase", (("phase", "waiting_on_peers"),))] == 1
    done = _samples(replace(pub, state="done", report=crashed, view=view))
    assert done[("nccl_doctor_phase", (("phase", "done"),))] == 1
    assert done[("nccl_doctor_hang_detected", ())] == 0


class _Supervisor:
    """What the publisher reads of a supervisor, set by the test."""

    def __init__(self) -> None:
        self.files = SimpleNamespace(report=None, report_text="")
        self.live = SimpleNamespace(run_files=self.files)
        self.state = SimpleNamespace(value="running")
        self.straggler = self.federation = None
        self.phase = "running"

    def view(self) -> LiveView:
        return LiveView((RankView(0, "nodeA", 4, RankState.WAITING),), self.phase, "", 1.0, 2.0)

    def at(self, state: str, phase: str, report) -> _Supervisor:
        self.state.value, self.phase, self.files.report = state, phase, report
        self.files.report_text = report.to_json_text() if report is not None else ""
        return self


def test_the_publisher_holds_a_hang_that_stood_when_the_job_ended(tb):
    hung = _hang(tb)
    retracted = replace(hung, verdict=Verdict.SUSPECT)
    crashed = replace(hung, verdict=Verdict.CRASH)
    sup, publisher = _Supervisor(), Publisher()

    def look(state: str, phase: str, report) -> bool:
        publisher(sup.at(state, phase, report))
        return publisher.current.hang_detected

    assert not look("running", "running", None)
    assert look("running", "hang", hung)
    assert not look("running", "computing", retracted)  # progress resumed: retracted
    assert look("running", "hang", hung)
    assert look("ended", "ended", crashed)  # it stood when the job ended: held to the exit
    assert look("analysing", "ended", crashed)
    assert look("done", "ended", crashed)
    assert publisher.current.phase == "hang" and publisher.current.final
    healthy, plain = _Supervisor(), Publisher()
    plain(healthy.at("running", "running", None))
    plain(healthy.at("done", "ended", replace(hung, verdict=Verdict.OK)))
    assert not plain.current.hang_detected and plain.current.phase == "done"


def test_the_final_look_read_is_told_once_its_report_is_served(tb):
    """``final_read``: a report path (``/``, report.json, report.html) answered in full from
    the final look; if /metrics was ever served, /metrics from the final look too."""
    looks = [_published(tb, report_html="<html>the report</html>")]
    endpoint = Endpoint("127.0.0.1", 0, lambda: looks[-1])
    try:
        base = endpoint.url
        assert _get(base + "report.json")[0] == 200  # a look of the running job: not final
        page = _get(base)[1].decode()
        assert 'http-equiv="refresh"' in page and "reloads every" in page
        looks.append(replace(looks[-1], state="done", at=looks[-1].at + 1))
        assert _get(base + "report.json", "HEAD")[0] == 200  # no report read
        assert _get(base + "status.json")[0] == 200
        assert not endpoint.final_read.is_set()
        status, body, _ = _get(base + "report.html")
        assert status == 200 and body == b"<html>the report</html>"
        assert endpoint.final_read.wait(5)
    finally:
        endpoint.close()
    looks = [_published(tb)]
    endpoint = Endpoint("127.0.0.1", 0, lambda: looks[-1])
    try:
        base = endpoint.url
        assert _get(base + "metrics")[0] == 200  # a scraper, from now on
        looks.append(replace(looks[-1], state="done", at=looks[-1].at + 1))
        status, body, _ = _get(base)
        page = body.decode()
        assert status == 200 and "HANG" in page
        # the final page is not reloaded: a browser keeps it once the endpoint is gone
        assert "http-equiv" not in page and "this page is final" in page
        assert not endpoint.final_read.is_set()  # the scraper has not seen the final look
        assert b'nccl_doctor_run_state{state="done"} 1.0' in _get(base + "metrics")[1]
        assert endpoint.final_read.wait(5)
    finally:
        endpoint.close()


class _Final:
    """A publisher whose look is ``current`` (the final one) whatever the supervisor."""

    def __init__(self, current: Published) -> None:
        self.current, self.looks = current, 0

    def __call__(self, supervisor) -> None:
        self.looks += 1


def test_the_linger_ends_once_the_final_report_is_read(tb):
    """``--serve-linger 600``: the linger waits on the endpoint's event, and a reader ends it."""
    publisher = _Final(replace(_published(tb), state="done"))
    endpoint = Endpoint("127.0.0.1", 0, lambda: publisher.current)
    err = io.StringIO()
    served = Serving(publisher, endpoint, 600.0, err)  # type: ignore[arg-type]
    served.watch(SimpleNamespace(attach=lambda listener: None), lambda: "")  # type: ignore[arg-type]
    lingering = threading.Thread(target=served.linger)
    try:
        lingering.start()
        deadline = time.monotonic() + 30
        while "for 600 s more" not in err.getvalue():
            assert time.monotonic() < deadline, err.getvalue()
            time.sleep(0.05)
        assert lingering.is_alive() and publisher.looks == 1
        assert _get(endpoint.url + "report.json")[0] == 200
        lingering.join(60)
        assert not lingering.is_alive(), "the linger did not end once the report was read"
        assert f"the final report was read at {endpoint.url}" in err.getvalue()
    finally:
        endpoint.final_read.set()
        lingering.join(10)
        endpoint.close()


def _fences(markdown: str) -> list[str]:
    return [m.group(1) for m in re.finditer(r"^```yaml\n(.*?)^```$", markdown, re.S | re.M)]


def test_the_docs_show_the_example_prometheus_files_as_they_are():
    """docs/serve.md shows docs/examples' prometheus.yml and rules as they are: the files the
    tests run (promtool, the real Prometheus of tests/e2e/test_serve.py)."""
    fences = _fences((ROOT / "docs" / "serve.md").read_text(encoding="utf-8"))
    for name in ("prometheus.yml", "nccl-doctor-alerts.yml"):
        text = (ROOT / "docs" / "examples" / name).read_text(encoding="utf-8")
        assert text in fences, f"docs/serve.md does not show docs/examples/{name} as it is"
    assert "nccl_doctor_hang_detected == 1" in "".join(fences)
