"""The live status of `nccl-doctor run`: a bar on a real terminal (a pty, read back through the
pyte terminal emulator) that never touches the job's output, and plain lines when not a TTY."""

from __future__ import annotations

import fcntl
import os
import pty
import re
import select
import struct
import sys
import termios
import time

import pyte
import pytest

from .conftest import CLI, JOBS, doctor, spawn_command

pytestmark = pytest.mark.integration

ROWS, COLS = 16, 100


def torchrun(nproc: int, script: str) -> list[str]:
    """torchrun's command (its banner and its workers' output, through it, on the terminal)."""
    return [sys.executable, "-m", "torch.distributed.run", "--standalone",
            f"--nproc-per-node={nproc}", str(JOBS / script)]


def spawn(nproc: int, script: str) -> list[str]:
    """The ranks forked by the fork server, where the launcher is not what is looked at."""
    return spawn_command(nproc, [str(JOBS / script)])


def on_terminal(args: list[str], env: dict[str, str], timeout: float = 180):
    """Run ``args`` on a fresh ROWS x COLS pty; return (exit status, screen, bottom rows seen,
    raw bytes). The bottom row is read after every chunk of output."""
    pid, fd = pty.fork()
    if pid == 0:  # the child: the doctor, on the pty
        try:
            os.execvpe(args[0], args, env)
        finally:
            os._exit(127)
    fcntl.ioctl(fd, termios.TIOCSWINSZ, struct.pack("HHHH", ROWS, COLS, 0, 0))
    screen = pyte.HistoryScreen(COLS, ROWS, history=100000)
    stream = pyte.ByteStream(screen)
    bottoms, raw = [], b""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        ready, _, _ = select.select([fd], [], [], 0.5)
        if not ready:
            continue
        try:
            data = os.read(fd, 65536)
        except OSError:  # EIO: the doctor has exited and the pty is closed
            break
        if not data:
            break
        raw += data
        stream.feed(data)
        bottoms.append(screen.display[-1].rstrip())
    else:
        os.kill(pid, 9)
    _, status = os.waitpid(pid, 0)
    os.close(fd)
    return os.waitstatus_to_exitcode(status), screen, bottoms, raw


def all_lines(screen: pyte.HistoryScreen) -> list[str]:
    def text(row) -> str:
        return "".join(row[x].data for x in range(COLS)).rstrip()
    return [text(row) for row in screen.history.top] + [ln.rstrip() for ln in screen.display]


def test_bar_on_a_terminal_keeps_the_jobs_output_intact(tmp_path):
    # the job writes 3x more lines than the terminal has rows: they scroll under the bar
    env = dict(os.environ, LINES="48", PAUSE="0.06")
    env.pop("CI", None)
    code, screen, bottoms, raw = on_terminal(
        [*CLI, "run", "--out", str(tmp_path / "o"), "--", *torchrun(2, "chatty.py")], env)
    assert code == 0, raw[-2000:]
    bars = [b for b in bottoms if b.startswith(" nccl-doctor")]
    assert any("2 ranks" in b and "running" in b for b in bars), bottoms
    # while the bar was up, the job's output never landed on its row
    assert not any("job line" in b for b in bottoms), [b for b in bottoms if "job line" in b]
    # every line the job printed is on the terminal, whole and in order, once
    job = [ln for ln in all_lines(screen) if "job line" in ln]
    assert job == [(f"job line {i:03d} " + "x" * (i % 50)).rstrip() for i in range(48)]
    # the bar's row is given back: no scrolling region is left, the summary follows the job
    regions = [m.start() for m in re.finditer(rb"\x1b\[1;\d+r", raw)]
    assert regions and raw.rfind(b"\x1b[r") > regions[-1]
    assert screen.margins is None or screen.margins == pyte.screens.Margins(0, ROWS - 1)
    assert any("OK - no problem found" in ln for ln in all_lines(screen))


def test_bar_shows_the_hang_as_it_is_called(tmp_path):
    env = dict(os.environ, SKIPPER="1")
    env.pop("CI", None)
    code, screen, bottoms, raw = on_terminal(
        [*CLI, "run", "--out", str(tmp_path / "o"), "--", *spawn(3, "skip_broadcast.py")], env)
    assert code == 124, raw[-2000:]
    phases = [b for b in bottoms if b.startswith(" nccl-doctor")]
    assert any(" deadlock " in b for b in phases) and any(" hang " in b for b in phases), phases
    lines = all_lines(screen)
    assert any(ln.startswith("nccl-doctor: HANG: ") for ln in lines), lines


def test_plain_status_when_not_a_tty(tmp_path):
    proc = doctor("run", "--out", str(tmp_path / "o"), "--", *spawn(3, "skip_broadcast.py"),
                  env=dict(os.environ, SKIPPER="2"))
    assert proc.returncode == 124, proc.stderr[-3000:]
    assert "\x1b" not in proc.stderr  # no escape codes in a log
    status = [ln for ln in proc.stderr.splitlines() if ln.startswith("nccl-doctor: [")]
    # the deadlock is shown with each rank's counter and state, then the hang
    assert any("deadlock; Python calls 0:" in ln and "/waiting" in ln for ln in status), \
        proc.stderr
    assert any(ln.startswith("nccl-doctor: HANG: ") for ln in proc.stderr.splitlines())


def test_quiet_prints_nothing_of_its_own(tmp_path):
    proc = doctor("run", "--quiet", "--out", str(tmp_path / "o"), "--", *spawn(3,
                  "skip_broadcast.py"), env=dict(os.environ, SKIPPER="2"))
    assert proc.returncode == 124
    assert not [ln for ln in proc.stderr.splitlines() if ln.startswith("nccl-doctor")], \
        proc.stderr


def test_replay_reads_many_captures_under_a_progress_bar_on_a_terminal_only(tmp_path,
                                                                           write_desync):
    capture = write_desync(tmp_path, 64, culprit=5)
    env = dict(os.environ)
    env.pop("CI", None)
    code, screen, _bottoms, raw = on_terminal(
        [*CLI, "replay", str(capture), "-o", str(tmp_path / "r.json")], env, timeout=120)
    assert code == 0, raw[-2000:]
    assert b"reading captures" in raw and b"/64" in raw, raw[-2000:]
    assert not any("reading captures" in line for line in screen.display)  # transient: gone
    off = doctor("replay", str(capture), "-o", str(tmp_path / "again.json"))
    assert off.returncode == 0 and "reading captures" not in off.stderr, off.stderr[-2000:]
    (tmp_path / "few").mkdir()
    few = write_desync(tmp_path / "few", 4, culprit=1)
    code, _screen, _bottoms, raw = on_terminal(
        [*CLI, "replay", str(few), "-o", str(tmp_path / "few.json")], env, timeout=120)
    assert code == 0 and b"reading captures" not in raw, raw[-2000:]
