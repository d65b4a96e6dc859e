"""nccl_doctor.testing.spawn, the launcher of the pytest plugin's ranks: torch's environment
contract for each rank, torchrun's ending (a failed rank stops the others; exit 1), signals
passed on. Real processes (small Python ranks, no torch)."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time

SPAWN = [sys.executable, "-m", "nccl_doctor.testing.spawn"]


def test_each_rank_gets_torchs_environment(tmp_path):
    probe = tmp_path / "probe.py"
    probe.write_text(
        "import json, os, sys\n"
        "keys = ['RANK', 'LOCAL_RANK', 'WORLD_SIZE', 'LOCAL_WORLD_SIZE', 'GROUP_RANK',\n"
        "        'MASTER_ADDR', 'MASTER_PORT', 'OMP_NUM_THREADS']\n"
        "seen = {k: os.environ[k] for k in keys}\n"
        "open(sys.argv[1] + os.environ['RANK'], 'w').write(json.dumps(seen))\n")
    done = subprocess.run([*SPAWN, "--nproc", "3", str(probe), str(tmp_path / "rank")],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    seen = [json.loads((tmp_path / f"rank{r}").read_text()) for r in range(3)]
    assert [s["RANK"] for s in seen] == [s["LOCAL_RANK"] for s in seen] == ["0", "1", "2"]
    assert {s["WORLD_SIZE"] for s in seen} == {s["LOCAL_WORLD_SIZE"] for s in seen} == {"3"}
    assert {s["MASTER_ADDR"] for s in seen} == {"127.0.0.1"}
    assert {s["GROUP_RANK"] for s in seen} == {"0"}
    assert len({s["MASTER_PORT"] for s in seen}) == 1 and int(seen[0]["MASTER_PORT"]) > 0
    assert {s["OMP_NUM_THREADS"] for s in seen} == {"1"}


def test_a_failed_rank_stops_the_others_and_the_launcher_exits_1(tmp_path):
    job = tmp_path / "job.py"
    job.write_text("import os, sys, time\n"
                   "if os.environ['RANK'] == '1':\n    sys.exit(3)\n"
                   "time.sleep(120)\n")
    started = time.monotonic()
    done = subprocess.run([*SPAWN, "--nproc", "3", str(job)], capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 1  # torchrun's status for a failed worker
    assert time.monotonic() - started < 30  # the sleeping ranks were stopped, not waited for


def test_sigterm_to_the_launcher_reaches_every_rank(tmp_path):
    job = tmp_path / "job.py"
    job.write_text("import os, signal, sys, time\n"
                   "def bye(*_):\n"
                   "    open(sys.argv[1] + os.environ['RANK'], 'w').write('term')\n"
                   "    sys.exit(0)\n"
                   "signal.signal(signal.SIGTERM, bye)\n"
                   "open(sys.argv[1] + os.environ['RANK'] + '.up', 'w').close()\n"
                   "time.sleep(120)\n")
    proc = subprocess.Popen([*SPAWN, "--nproc", "2", str(job), str(tmp_path / "r")],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 30
    while not all((tmp_path / f"r{r}.up").exists() for r in range(2)):
        assert time.monotonic() < deadline and proc.poll() is None
        time.sleep(0.05)
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=30) == 0  # each rank handled it and exited 0
    assert [(tmp_path / f"r{r}").read_text() for r in range(2)] == ["term", "term"]


def test_usage_is_one_line():
    done = subprocess.run([*SPAWN, "job.py"], capture_output=True, text=True, timeout=60)
    assert done.returncode == 2
    assert done.stderr.strip().startswith("usage: python -m nccl_doctor.testing.spawn --nproc")
