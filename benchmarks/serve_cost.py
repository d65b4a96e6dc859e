"""What ``run --serve`` costs the supervisor: idle, scraped, and under a request flood.

1. **Idle and scraped.** benchmarks/supervisor_idle.py's healthy pause (4 gloo ranks whose
   rings are full; rank 0 computes while the others wait), measured three ways, alternated
   ``--rounds`` times: without ``--serve``; with ``--serve`` and no request; with ``--serve``
   scraped like Prometheus would (``/metrics`` every ``--scrape`` seconds). The supervisor's
   own CPU over the pause, as a share of one core. The endpoint's idle cost is the difference.
2. **The hang's call under a flood.** benchmarks/hang_detection.py's deadlock (4 ranks, one
   skips a broadcast, torchrun) under ``nccl-doctor run --serve``, alone and while a separate
   process sends requests back to back on loopback (``--flood`` threads: /, /metrics,
   /status.json, /report.json): time from the last rank blocking to report.json written.

    python benchmarks/serve_cost.py [--rounds 2] [--pause 40] [--scrape 1] [--flood 4] [--runs 3]

Goal (issue 34): no measurable cost while idle; the hang's call not slowed by requests. The last
line is

  serve_cost idle_plain=P idle_serve=S scraped=C call_alone_s=A call_flood_s=F flood_rps=R
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from hang_detection import JOB, deadlock_to_report  # noqa: E402
from supervisor_idle import free_port, measure  # noqa: E402

FLOOD = r"""
import sys, threading, time, urllib.request
base, threads, seconds = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
start = time.monotonic()
done, last = [0] * threads, [start] * threads
def hammer(i):
    paths = ["", "metrics", "status.json", "report.json"]
    n = 0
    while time.monotonic() < start + seconds:
        try:
            urllib.request.urlopen(base + paths[n % 4], timeout=5).read()
            done[i] += 1
            last[i] = time.monotonic()
        except Exception:  # 404 before the report, or the endpoint gone with the run
            time.sleep(0.01)
        n += 1
ts = [threading.Thread(target=hammer, args=(i,)) for i in range(threads)]
[t.start() for t in ts]
[t.join() for t in ts]
print(sum(done), max(last) - start)
"""


class Scraper:
    """``/metrics`` every ``every`` seconds until ``close`` (a Prometheus stand-in: one GET)."""

    def __init__(self, url: str, every: float) -> None:
        self.url, self.every, self.count = url, every, 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(self.every):
            try:
                urllib.request.urlopen(self.url, timeout=5).read()
                self.count += 1
            except OSError:
                pass

    def close(self) -> None:
        self._stop.set()
        self._thread.join(10)


def idle(args: argparse.Namespace) -> dict[str, list[float]]:
    shares: dict[str, list[float]] = {"plain": [], "serve": [], "scraped": []}
    for _ in range(args.rounds):
        for name in shares:
            port = free_port()
            extra = () if name == "plain" else ("--serve", f"127.0.0.1:{port}")
            during = (lambda: Scraper(f"http://127.0.0.1:{port}/metrics", args.scrape)) \
                if name == "scraped" else None
            r = measure(args.ranks, args.pause, args.calls, 5.0, extra, during)
            if r["status"] != 0 or r["verdict"] != "ok":
                raise SystemExit(f"{name}: not a healthy run: {r}")
            shares[name].append(r["own"])
            print(f"  {name:>8}: supervisor {r['own']:.2%} of a core over {r['span_s']:.0f} s",
                  flush=True)
    return shares


def call(flood: int) -> tuple[float, float]:
    """(deadlock -> report written, s; requests answered per second during the flood)."""
    with tempfile.TemporaryDirectory(prefix="ncd-serve-") as tmp:
        out, port = Path(tmp) / "out", free_port()
        base = f"http://127.0.0.1:{port}/"
        doctor = Path(sys.executable).with_name("nccl-doctor")
        proc = subprocess.Popen(
            [str(doctor), "run", "--quiet", "--no-gpu", "--serve", f"127.0.0.1:{port}",
             "--serve-linger", "0", "--out", str(out), "--", sys.executable, "-m",
             "torch.distributed.run", "--standalone", "--nproc-per-node=4", str(JOB)],
            env=dict(os.environ, SKIPPER="1"), stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL)
        flooder = None
        if flood:
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline:
                try:
                    urllib.request.urlopen(base + "status.json", timeout=2).read()
                    break
                except OSError:
                    time.sleep(0.1)
            flooder = subprocess.Popen([sys.executable, "-c", FLOOD, base, str(flood), "60"],
                                       stdout=subprocess.PIPE, text=True)
        proc.wait(300)
        made = 0.0
        if flooder is not None:
            n, span = flooder.communicate(timeout=120)[0].split()
            made = int(n) / max(float(span), 1e-3)  # requests answered per second
        return deadlock_to_report(out), made


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--pause", type=float, default=40.0)
    ap.add_argument("--ranks", type=int, default=4)
    ap.add_argument("--calls", type=int, default=33_000)
    ap.add_argument("--scrape", type=float, default=1.0)
    ap.add_argument("--flood", type=int, default=4)
    ap.add_argument("--runs", type=int, default=3)
    args = ap.parse_args()
    print(f"idle: {args.ranks} ranks, a {args.pause:.0f} s healthy pause, {args.rounds} rounds")
    shares = idle(args)
    med = {k: statistics.median(v) for k, v in shares.items()}
    print(f"idle medians: without --serve {med['plain']:.2%}, --serve idle {med['serve']:.2%}, "
          f"scraped every {args.scrape:g} s {med['scraped']:.2%} (of one core)")
    alone, flooded, made = [], [], []
    for _ in range(args.runs):
        alone.append(call(0)[0])
        seconds, n = call(args.flood)
        flooded.append(seconds)
        made.append(n)
        print(f"  call alone {alone[-1]:.2f} s; under a flood ({n:.0f} requests/s "
              f"answered) {flooded[-1]:.2f} s", flush=True)
    a, f = statistics.median(alone), statistics.median(flooded)
    rps = statistics.median(made) if made else 0.0
    print(f"serve_cost idle_plain={med['plain']:.4f} idle_serve={med['serve']:.4f} "
          f"scraped={med['scraped']:.4f} call_alone_s={a:.2f} call_flood_s={f:.2f} "
          f"flood_rps={rps:.0f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
