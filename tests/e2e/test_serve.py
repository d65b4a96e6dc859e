"""``run --serve`` during a real hung job (issue 34): a real Prometheus server scrapes it and its
query API shows the hang and the culprit; headless Chromium loads the live page; a bounded
request flood on loopback meanwhile does not change the watchdog's call; the secrets on the
command line are served redacted; the final report stays up for --serve-linger.

Prometheus (Debian's ``prometheus``) and Chromium (``chromium``) are installed by ``make test-all``
(the Makefile's ``tools`` step)."""

from __future__ import annotations

import json
import os
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

JOBS = Path(__file__).resolve().parents[1] / "integration" / "jobs"
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
    def __init__(self, root: Path, target: str) -> None:
        self.port = free_port()
        config = root / "prometheus.yml"
        config.write_text(
            f"global:\n  scrape_interval: {SCRAPE_S:.0f}s\n  scrape_timeout: {SCRAPE_S:.0f}s\n"
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
        url = (f"http://127.0.0.1:{self.port}/api/v1/query?"
               + urllib.parse.urlencode({"query": q}))
        status, body = _get(url)
        data = json.loads(body)
        assert status == 200 and data["status"] == "success", data
        return data["data"]["result"]

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
        # --serve-linger, then all ends
        os.kill(run.pid, signal.SIGTERM)
        final = _wait("the final report", lambda: _phase(base) == "done", 120, None)
        assert final
        _, stderr = run.communicate(timeout=120)
        assert "serving the final report" in stderr, stderr[-2000:]
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


def _phase(base: str) -> str:
    try:
        status, body = _get(base + "status.json", 2)
    except OSError:
        return ""
    return json.loads(body)["phase"] if status == 200 else ""


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
