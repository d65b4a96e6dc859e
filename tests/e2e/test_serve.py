"""``run --serve`` during a real hung job (issue 34): a real Prometheus server scrapes it and its
query API shows the hang and the culprit; headless Chromium loads the live page; a bounded
request flood on loopback meanwhile does not change the watchdog's call; the secrets on the
command line are served redacted; the final report stays up for --serve-linger.

The alerts docs/serve.md shows (issue 43) are docs/examples' files, tested as they are: by
``promtool test rules`` (tests/e2e/nccl-doctor-alerts.test.yml), and in a real Prometheus run
with docs/examples/prometheus.yml (15 s scrapes) against a real hang stopped under
``--on-hang kill`` with the default linger: the alert fires. The linger ends once the final
report has been read.

Prometheus and promtool (Debian's ``prometheus``) and Chromium (``chromium``) are installed by
``make test-all`` (the Makefile's ``tools`` step)."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path

import pytest

from nccl_doctor.testing.spawn import free_port

pytestmark = pytest.mark.integration

HERE = Path(__file__).resolve().parent
JOBS = HERE.parent / "integration" / "jobs"
EXAMPLES = HERE.parents[1] / "docs" / "examples"
SCRAPE_S = 1.0
SECRET = "hf_sekrit_value_1234"
CHROMIUM_FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic",
                  "--no-first-run", "--disable-background-networking",
                  "--disable-component-update", "--disable-sync", "--hide-scrollbars"]


def _tool(name: str) -> str:
    found = shutil.which(name)
    assert found, (f"{name} is not installed: `make test-all` installs it (Debian's {name} package; "
                   "see the Makefile's tools step)")
    return found


def _get(url: str, timeout: float = 10.0) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as err:
        return err.code, err.read()


def _wait(what: str, check, timeout: float, proc: subprocess.Popen | None = None):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        got = check()
        if got:
            return got
        assert proc is None or proc.poll() is None, f"{what}: the run ended ({proc.returncode})"
        time.sleep(0.25)
    raise AssertionError(f"{what}: not within {timeout:.0f} s")


class Prometheus:
    """A real Prometheus server scraping ``target`` every ``SCRAPE_S``, or as ``config`` says
    (a prometheus.yml in ``root``)."""

    def __init__(self, root: Path, target: str, config: Path | None = None) -> None:
        self.port = free_port()
        if config is None:
            config = root / "prometheus.yml"
            config.write_text(
                f"global:\n  scrape_interval: {SCRAPE_S:.0f}s\n"
                f"  scrape_timeout: {SCRAPE_S:.0f}s\n"
                "scrape_configs:\n  - job_name: nccl-doctor\n    static_configs:\n"
                f"      - targets: ['{target}']\n")
        self.log = (root / "prometheus.log").open("wb")
        self.proc = subprocess.Popen(
            [_tool("prometheus"), f"--config.file={config}",
             f"--storage.tsdb.path={root / 'tsdb'}", f"--web.listen-address=127.0.0.1:{self.port}"],
            stdout=self.log, stderr=subprocess.STDOUT, start_new_session=True)
        _wait("prometheus ready", lambda: self._ready(), 60, self.proc)

    def _ready(self) -> bool:
        try:
            return _get(f"http://127.0.0.1:{self.port}/-/ready", 2)[0] == 200
        except OSError:
            return False

    def query(self, q: str) -> list[dict]:
        return self._api("query?" + urllib.parse.urlencode({"query": q}))["result"]

    def alerts(self) -> list[dict]:
        """The alerts pending or firing now (the rules' own evaluation)."""
        return self._api("alerts")["alerts"]

    def _api(self, what: str):
        status, body = _get(f"http://127.0.0.1:{self.port}/api/v1/{what}")
        data = json.loads(body)
        assert status == 200 and data["status"] == "success", data
        return data["data"]

    def close(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(10)
        self.log.close()


def _flood(base: str, stop: threading.Event, counts: dict) -> None:
    """Requests back to back, on loopback only, until ``stop`` (bounded by the test)."""
    paths = ["", "metrics", "status.json", "report.json"]
    i = 0
    while not stop.is_set():
        try:
            status, _ = _get(base + paths[i % len(paths)], 5)
        except OSError as err:
            status = type(err).__name__
        counts[status] = counts.get(status, 0) + 1
        i += 1


def test_a_hang_is_scraped_by_prometheus_and_shown_in_chromium(tmp_path):
    port = free_port()
    base = f"http://127.0.0.1:{port}/"
    out = tmp_path / "out"
    prom = Prometheus(tmp_path, f"127.0.0.1:{port}")
    env = dict(os.environ, SKIPPER="2")
    run = subprocess.Popen(
        [sys.executable, "-m", "nccl_doctor", "run", "--no-gpu", "--quiet", "--serve",
         f"127.0.0.1:{port}", "--on-hang", "report", "--serve-linger", "5", "--out", str(out),
         "--", sys.executable, "-m", "nccl_doctor.testing.spawn", "--nproc", "3",
         str(JOBS / "skip_broadcast.py"), "--hf-token", SECRET],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        start_new_session=True)
    stop, counts = threading.Event(), {}
    flood = [threading.Thread(target=_flood, args=(base, stop, counts), daemon=True)
             for _ in range(4)]
    try:
        _wait("the endpoint", lambda: _ok(base + "status.json"), 60, run)
        for t in flood:
            t.start()
        # Prometheus's query API shows the hang and its culprit
        hang = _wait("the hang in Prometheus",
                     lambda: prom.query('nccl_doctor_phase{phase="hang"} == 1'), 120, run)
        assert hang[0]["metric"]["job"] == "nccl-doctor"
        assert prom.query("nccl_doctor_hang_detected == 1")
        stop.set()
        for t in flood:
            t.join(10)
        culprit = prom.query("nccl_doctor_root_cause")
        assert [(c["metric"]["rank"], c["metric"]["kind"]) for c in culprit] == [
            ("2", "collective_mismatch")], culprit
        assert prom.query('nccl_doctor_verdict{verdict="hang"} == 1')
        waiting = prom.query('nccl_doctor_rank_state{state="waiting"}')
        assert {w["metric"]["rank"] for w in waiting} == {"0", "1", "2"}
        # the call, as the watchdog kept it: a certain deadlock, called as such under the flood
        record = json.loads((out / "watchdog.json").read_text())
        (called,) = [e for e in record["events"] if e["event"] == "hang"]
        assert called["watchdog"]["how"] == "deadlock", called["watchdog"]
        served = sum(n for k, n in counts.items() if k in (200, 404))
        assert served > 50 and set(counts) <= {200, 404, 503}, counts
        # every scrape after the call (and the supervisor's next look) showed the hang: the
        # first scrape after the call did, within one scrape interval of it
        stale = prom.query('nccl_doctor_phase{phase!="hang"}[5m]')
        after = [float(t) for s in stale for t, _ in s["values"] if float(t) > called["at"] + 0.5]
        assert not after, (called["at"], after)
        first = min(float(t) for s in prom.query('nccl_doctor_phase{phase="hang"}[5m]')
                    for t, _ in s["values"])
        print(f"hang called at {called['at']:.3f}; first scrape showing it {first:.3f} "
              f"({first - called['at']:.2f} s later, scrape interval {SCRAPE_S} s); "
              f"{served} requests served during the flood")
        # the served report is the file's, redacted as it is
        status, body = _get(base + "report.json")
        assert status == 200 and SECRET not in body.decode()
        assert json.loads(body)["verdict"] == "hang"
        for path in ("", "status.json", "metrics"):
            assert SECRET not in _get(base + path)[1].decode()
        _chromium(tmp_path, base)
        # the job ended (SIGTERM, forwarded to it): the final report is served for
        # --serve-linger, then all ends; the phase stays hang, the run's state says it is over
        os.kill(run.pid, signal.SIGTERM)
        final = _wait("the final report", lambda: _status(base).get("state") == "done", 120,
                      None)
        assert final
        last = _status(base)
        assert (last["phase"], last["verdict"], last["hang_detected"]) == ("hang", "hang", True)
        _, stderr = run.communicate(timeout=120)
        assert "serving the final report" in stderr, stderr[-2000:]
        # every scrape after the call showed the hang, the final look's among them (scraped
        # during the linger): never a transient done
        done = prom.query('nccl_doctor_run_state{state="done"}[5m]')
        assert done and done[0]["values"], "no scrape of the final look"
        stale = prom.query('nccl_doctor_phase{phase!="hang"}[5m]')
        after = [float(t) for s in stale for t, _ in s["values"] if float(t) > called["at"] + 0.5]
        assert not after, (called["at"], after)
        detected = prom.query("nccl_doctor_hang_detected[5m]")
        assert not [v for t, v in detected[0]["values"] if float(t) > called["at"] + 0.5
                    and v != "1"], detected
        # thousands of requests, clients hanging up: nothing of it on the job's terminal
        assert "Traceback" not in stderr and "Exception" not in stderr, stderr[-3000:]
        with pytest.raises(OSError):
            _get(base + "status.json", 2)
    finally:
        stop.set()
        if run.poll() is None:
            os.killpg(run.pid, signal.SIGKILL)
            run.wait(30)
        prom.close()


def _ok(url: str) -> bool:
    try:
        return _get(url, 2)[0] == 200
    except OSError:
        return False


def _status(base: str) -> dict:
    try:
        status, body = _get(base + "status.json", 2)
    except OSError:
        return {}
    return json.loads(body) if status == 200 else {}


def _chromium(tmp_path: Path, base: str) -> None:
    """The live page in headless Chromium: its DOM names the verdict and the culprit, and its
    screenshot shows the hang's red banner."""
    chromium = _tool("chromium")
    profile = tmp_path / "chromium-profile"
    dom = subprocess.run([chromium, *CHROMIUM_FLAGS, f"--user-data-dir={profile}",
                          "--dump-dom", base], capture_output=True, text=True, timeout=120)
    assert dom.returncode == 0, dom.stderr[-2000:]
    assert "<h1 id=\"verdict\">HANG</h1>" in dom.stdout, dom.stdout[:2000]
    assert "<b id=\"culprit\">2</b>" in dom.stdout
    shot = tmp_path / "page.png"
    taken = subprocess.run([chromium, *CHROMIUM_FLAGS, f"--user-data-dir={profile}",
                            "--window-size=1000,700", f"--screenshot={shot}", base],
                           capture_output=True, text=True, timeout=120)
    assert taken.returncode == 0 and shot.is_file(), taken.stderr[-2000:]
    from PIL import Image
    with Image.open(shot) as img:
        rgb = img.convert("RGB")
        banner = rgb.getpixel((5, 5))
        body = rgb.getpixel((5, rgb.height - 5))
    assert banner == (0xB0, 0x00, 0x20), banner  # the hang's red header
    assert body != banner


def test_the_documented_alert_rules_pass_promtool():
    """``promtool test rules`` on the rules docs/serve.md shows: a hang stopped under
    --on-hang kill fires (naming the culprit), a retracted one resolves, a healthy job fires
    nothing, a silent rank fires after 600 s."""
    tests = HERE / "nccl-doctor-alerts.test.yml"
    proc = subprocess.run([_tool("promtool"), "test", "rules", str(tests)], cwd=HERE,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0 and "SUCCESS" in proc.stdout, proc.stdout + proc.stderr
    print(proc.stdout)


class _Lines:
    """A stream's lines as they come (a thread reads them: a test waits on them)."""

    def __init__(self, stream) -> None:
        self.lines: list[str] = []
        self._thread = threading.Thread(target=self.lines.extend, args=(stream,), daemon=True)
        self._thread.start()

    def text(self, to_the_end: bool = False) -> str:
        if to_the_end:
            self._thread.join(30)
        return "".join(self.lines)


def _hung_run(port: int, out: Path, *options: str) -> subprocess.Popen:
    """A real 3-rank gloo job whose rank 2 skips a broadcast, under ``run --serve``."""
    return subprocess.Popen(
        [sys.executable, "-m", "nccl_doctor", "run", "--no-gpu", "--quiet", "--serve",
         f"127.0.0.1:{port}", *options, "--out", str(out), "--", sys.executable, "-m",
         "nccl_doctor.testing.spawn", "--nproc", "3", str(JOBS / "skip_broadcast.py")],
        env=dict(os.environ, SKIPPER="2"), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
        text=True, start_new_session=True)


def test_the_documented_alert_fires_on_a_hang_stopped_under_kill(tmp_path):
    """docs/examples/prometheus.yml (15 s scrapes and evaluations) and nccl-doctor-alerts.yml,
    as they are but for the target, in a real Prometheus: a real hang stopped under the default
    --on-hang kill, with the default --serve-linger (30 s), fires TrainingJobHung naming the
    culprit - the hang is up from the call to the exit, so at least two scrapes see it. (The
    alerts API is the rule's evaluation, what is sent to an Alertmanager; the ALERTS series is
    not written until a freshly started Prometheus has evaluated its rules twice.)"""
    port = free_port()
    documented = (EXAMPLES / "prometheus.yml").read_text()
    assert "scrape_interval: 15s" in documented and "evaluation_interval: 15s" in documented
    root = tmp_path / "prometheus"
    root.mkdir()
    config = root / "prometheus.yml"
    config.write_text(documented.replace("node0:9400", f"127.0.0.1:{port}"))
    shutil.copy(EXAMPLES / "nccl-doctor-alerts.yml", root)
    prom = Prometheus(root, "", config)
    out = tmp_path / "out"
    run = _hung_run(port, out)  # --on-hang kill and --serve-linger 30: the defaults
    stderr = _Lines(run.stderr)
    fired: list[dict] = []
    try:
        deadline = time.monotonic() + 240
        ended = None
        # the alert fires while the endpoint serves the hang, or at the evaluation after the
        # exit that still sees the last scrape: watched until then (up to 3 evaluations)
        while not fired and (ended is None or time.monotonic() < ended + 45):
            assert time.monotonic() < deadline, ("no alert", prom.alerts(), stderr.text())
            fired = [a for a in prom.alerts() if a["labels"]["alertname"] == "TrainingJobHung"
                     and a["state"] == "firing"]
            if ended is None and run.poll() is not None:
                ended = time.monotonic()
            time.sleep(0.5)
        assert run.wait(120) == 124, stderr.text(True)[-3000:]  # stopped for the hang
        assert fired, ("TrainingJobHung never fired", prom.query("nccl_doctor_hang_detected"))
        alert = fired[0]
        assert alert["labels"]["instance"] == f"127.0.0.1:{port}"
        assert alert["labels"]["severity"] == "page"
        assert alert["annotations"]["summary"].startswith("training job hung; rank 2 on "), alert
        assert "skip_broadcast.py:" in alert["annotations"]["summary"], alert
        text = stderr.text(True)
        assert "serving the final report" in text and "for 30 s more" in text, text[-2000:]
        assert "the final report was read" not in text  # nobody read it: the whole linger
        record = json.loads((out / "watchdog.json").read_text())
        (called,) = [e for e in record["events"] if e["event"] == "hang"]
        seen = [float(t) for s in prom.query("nccl_doctor_hang_detected[10m]")
                for t, v in s["values"] if v == "1"]
        assert len(seen) >= 2 and min(seen) > called["at"], (called["at"], seen)
        phases = prom.query("nccl_doctor_phase[10m]")
        assert not [(s["metric"]["phase"], t) for s in phases for t, _ in s["values"]
                    if float(t) > called["at"] + 0.5 and s["metric"]["phase"] != "hang"]
        print(f"hang called at {called['at']:.1f}; scrapes showing it at "
              f"{[round(t - called['at'], 1) for t in seen]} s after; alert active at "
              f"{alert['activeAt']}")
    finally:
        if run.poll() is None:
            os.killpg(run.pid, signal.SIGKILL)
            run.wait(30)
        prom.close()


def test_the_linger_ends_once_the_final_report_is_read(tmp_path):
    """--serve-linger 600, and the endpoint scraped while the job runs: once the final look is
    published, fetching the final report is not enough while the scraper has not seen it; the
    scrape of the final look is, and the run ends - long before its linger."""
    port = free_port()
    base = f"http://127.0.0.1:{port}/"
    run = _hung_run(port, tmp_path / "out", "--serve-linger", "600")
    stderr = _Lines(run.stderr)
    try:
        _wait("the endpoint", lambda: _ok(base + "metrics"), 60, run)  # a scraper, from now
        said = _wait("the final look", lambda: re.search(
            r"serving the final report at (\S+) for 600 s more", stderr.text()), 120, run)
        assert said.group(1) == base
        last = _status(base)
        assert (last["state"], last["phase"], last["verdict"]) == ("done", "hang", "hang")
        status, body = _get(base + "report.json")
        assert status == 200 and json.loads(body)["verdict"] == "hang"
        # the report was read, the scraper has not seen the final look yet: the linger goes on
        with pytest.raises(subprocess.TimeoutExpired):
            run.wait(1.0)
        status, body = _get(base + "metrics")
        assert status == 200
        text = body.decode()
        assert "nccl_doctor_hang_detected 1.0" in text
        assert 'nccl_doctor_phase{phase="hang"} 1.0' in text
        assert 'nccl_doctor_run_state{state="done"} 1.0' in text
        assert run.wait(60) == 124  # the linger's 600 s cut short by the reads
        text = stderr.text(True)
        assert "the final report was read at " + base in text, text[-2000:]
        with pytest.raises(OSError):
            _get(base + "status.json", 2)
    finally:
        if run.poll() is None:
            os.killpg(run.pid, signal.SIGKILL)
            run.wait(30)
