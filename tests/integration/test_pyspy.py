"""Real py-spy on real Python processes: collect, classify, stopped and dead ranks, failures."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Callable

import psutil
import pytest

from nccl_doctor.stacks.aggregate import classify, format_classes
from nccl_doctor.stacks.rank_stack import RankStack
from nccl_doctor.supervisor.pyspy import PYSPY_ENV, collect, dump, find_pyspy

pytestmark = pytest.mark.integration

# One program, two roles: the main thread either waits (like a rank stuck in a barrier) or spins
# (like a rank still computing). Both run out on their own should a test die without cleaning up.
RANK_PROGRAM = textwrap.dedent(
    """
    import sys, time

    def waiting_in_barrier():
        print("ready", flush=True)
        time.sleep(60)

    def computing():
        print("ready", flush=True)
        deadline = time.monotonic() + 60
        x = 0
        while time.monotonic() < deadline:
            x += 1

    {"wait": waiting_in_barrier, "compute": computing}[sys.argv[1]]()
    """
)

Spawn = Callable[[str], subprocess.Popen]


def line_of(code: str) -> int:
    """The line number of ``code`` in RANK_PROGRAM."""
    return [ln.strip() for ln in RANK_PROGRAM.splitlines()].index(code) + 1


@pytest.fixture
def spawn(tmp_path: Path):
    """Start rank-like processes in a given role; every one is killed and reaped afterwards."""
    program = tmp_path / "rank.py"
    program.write_text(RANK_PROGRAM)
    started: list[subprocess.Popen] = []

    def start(role: str) -> subprocess.Popen:
        proc = subprocess.Popen([sys.executable, str(program), role], stdout=subprocess.PIPE,
                                stdin=subprocess.DEVNULL, text=True)
        started.append(proc)
        assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
        return proc

    try:
        yield start
    finally:
        for proc in started:
            if proc.poll() is None:
                os.kill(proc.pid, signal.SIGCONT)  # a stopped process would not die until then
                proc.kill()
            proc.wait(timeout=10)
            assert proc.stdout is not None
            proc.stdout.close()


def main_functions(stack: RankStack) -> list[str]:
    assert stack.main is not None, stack.error
    return [f.function for f in stack.main.frames]


def test_collect_samples_every_rank_and_classify_finds_the_odd_one(spawn: Spawn):
    procs = {0: spawn("wait"), 1: spawn("compute"), 2: spawn("wait")}
    before = time.time()
    stacks = collect({rank: p.pid for rank, p in procs.items()}, timeout=10)
    assert sorted(stacks) == [0, 1, 2]
    for rank, stack in stacks.items():
        assert stack.error is None, stack.error
        assert (stack.rank, stack.pid, stack.source) == (rank, procs[rank].pid, "py-spy")
        assert before <= stack.taken_at <= time.time()
        assert stack.main is not None and stack.main.is_main
    # time.sleep is C code: the innermost Python frame is the function that called it
    assert main_functions(stacks[0])[:2] == ["waiting_in_barrier", "<module>"]
    assert main_functions(stacks[2])[:2] == ["waiting_in_barrier", "<module>"]
    assert main_functions(stacks[1])[:2] == ["computing", "<module>"]

    classes = classify(stacks)
    assert [(c.ranks, c.odd) for c in classes] == [((0, 2), False), ((1,), True)]
    assert classes[1].frames[-1].function == "computing"
    lines = format_classes(classes)
    dispatch = line_of('{"wait": waiting_in_barrier, "compute": computing}[sys.argv[1]]()')
    assert lines[0] == f"all ranks: rank.py:{dispatch} <module>"
    sleep = line_of("time.sleep(60)")
    assert lines[1] == f"ranks 0, 2 (2): ... -> rank.py:{sleep} waiting_in_barrier"
    assert "computing" in lines[2] and lines[2].endswith("<- odd one out")


def test_a_stopped_process_is_dumped_without_resuming_it(spawn: Spawn):
    proc = spawn("compute")
    os.kill(proc.pid, signal.SIGSTOP)
    ps = psutil.Process(proc.pid)
    deadline = time.monotonic() + 5
    while ps.status() != psutil.STATUS_STOPPED and time.monotonic() < deadline:
        time.sleep(0.01)
    assert ps.status() == psutil.STATUS_STOPPED

    first = collect({0: proc.pid}, timeout=10)[0]
    second = collect({0: proc.pid}, timeout=10)[0]
    assert first.error is None, first.error
    assert main_functions(first)[0] == "computing"
    assert first.signature() == second.signature()  # a stopped rank does not move
    assert ps.status() == psutil.STATUS_STOPPED  # --nonblocking: py-spy never touched its state


def test_a_dead_pid_is_an_error_string(spawn: Spawn):
    proc = spawn("wait")
    proc.kill()
    proc.wait(timeout=10)
    threads, error = dump(proc.pid)
    assert threads is None and error == f"process {proc.pid} is gone"
    stack = collect({5: proc.pid})[5]
    assert stack.threads == () and stack.main is None
    assert stack.error == f"process {proc.pid} is gone"
    assert classify({5: stack})[0].missing


def test_a_process_that_is_not_python_is_an_error_string():
    proc = subprocess.Popen(["sleep", "30"])
    try:
        threads, error = dump(proc.pid, timeout=10)
    finally:
        proc.kill()
        proc.wait(timeout=10)
    assert threads is None
    assert error is not None and error.startswith(f"py-spy on pid {proc.pid}: ")
    assert "python" in error.lower() and "\n" not in error


@pytest.mark.parametrize("value", ["none", "", "NONE"])
def test_pyspy_can_be_turned_off(monkeypatch: pytest.MonkeyPatch, value: str):
    monkeypatch.setenv(PYSPY_ENV, value)
    assert find_pyspy() is None
    stacks = collect({0: os.getpid(), 1: os.getppid()})
    assert [s.rank for s in stacks.values()] == [0, 1]
    for stack in stacks.values():
        assert stack.threads == ()
        assert stack.error is not None and stack.error.startswith("py-spy is unavailable")
        assert PYSPY_ENV in stack.error
    assert dump(os.getpid())[1] == stacks[0].error


def test_find_pyspy_prefers_the_variable_then_the_one_beside_python(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
):
    monkeypatch.setenv(PYSPY_ENV, str(tmp_path / "my-py-spy"))
    assert find_pyspy() == str(tmp_path / "my-py-spy")  # as given, even if wrong: dump says so
    monkeypatch.delenv(PYSPY_ENV)
    beside = Path(sys.executable).parent / "py-spy"  # a venv's bin, where pip puts py-spy
    assert find_pyspy() == (str(beside) if beside.is_file() else shutil.which("py-spy"))
    assert find_pyspy() is not None  # the integration tests need a real one


def fake_pyspy(tmp_path: Path, body: str) -> str:
    """An executable standing in for py-spy, running ``body`` as Python."""
    path = tmp_path / "py-spy"
    path.write_text(f"#!{sys.executable}\nimport os, sys, time\n{textwrap.dedent(body)}")
    path.chmod(0o755)
    return str(path)


def test_a_hung_pyspy_is_killed_at_the_timeout(tmp_path: Path):
    pid_file = tmp_path / "pid"
    exe = fake_pyspy(tmp_path, f"""
        open({str(pid_file)!r}, "w").write(str(os.getpid()))
        time.sleep(30)
    """)
    start = time.monotonic()
    threads, error = dump(os.getpid(), timeout=1.0, pyspy=exe)
    assert time.monotonic() - start < 5
    assert threads is None and error == f"py-spy timed out after 1s on pid {os.getpid()}"
    assert not psutil.pid_exists(int(pid_file.read_text()))  # killed and reaped: no orphan


# py-spy 0.4.3's stderr when denied (recorded as root against a process it may not read, with
# RUST_BACKTRACE=0); a non-root user sees "Permission Denied: Try running again ..." instead.
DENIED_STDERR = """\
Error: Failed to get process executable name. Check that the process is running.

Caused by:
    0: Permission denied (os error 13)
    1: Permission denied (os error 13)
"""


@pytest.mark.parametrize("stderr", [
    DENIED_STDERR,
    "Permission Denied: Try running again with elevated permissions by going 'sudo env ...'\n",
    "Error: Failed to get stack traces\n\nCaused by:\n"
    "    0: Operation not permitted (os error 1)\n",
])
def test_permission_denied_is_one_line_that_says_what_to_do(tmp_path: Path, stderr: str):
    exe = fake_pyspy(tmp_path, f"sys.stderr.write({stderr!r}); sys.exit(1)")
    threads, error = dump(os.getpid(), pyspy=exe)
    assert threads is None and error is not None
    assert error.startswith(f"permission denied reading pid {os.getpid()}: ")
    assert "ptrace" in error and "\n" not in error


def test_other_pyspy_errors_keep_the_message_and_the_last_cause(tmp_path: Path):
    stderr = ("Error: Failed to get stack traces\n\nCaused by:\n    0: Failed to suspend process\n"
              "\nStack backtrace:\n   0: anyhow::error\n")
    exe = fake_pyspy(tmp_path, f"sys.stderr.write({stderr!r}); sys.exit(1)")
    _, error = dump(os.getpid(), pyspy=exe)
    assert error == (f"py-spy on pid {os.getpid()}: Failed to get stack traces "
                     "(Failed to suspend process)")


def test_unreadable_output_and_a_missing_binary_are_error_strings(tmp_path: Path):
    exe = fake_pyspy(tmp_path, "print('this is not json')")
    threads, error = dump(os.getpid(), pyspy=exe)
    assert threads is None and error is not None and "unreadable output" in error
    stack = collect({0: os.getpid()}, pyspy=exe)[0]
    assert stack.error == error

    exe = fake_pyspy(tmp_path, "print('[{\"thread_id\": \"x\", \"frames\": []}]')")
    stack = collect({0: os.getpid()}, pyspy=exe)[0]
    assert stack.error is not None and stack.error.startswith("py-spy output: ")
    assert "thread_id" in stack.error

    missing = str(tmp_path / "nowhere" / "py-spy")
    threads, error = dump(os.getpid(), pyspy=missing)
    assert threads is None and error == f"cannot run py-spy at {missing}: No such file or directory"
    assert dump(0) == (None, "invalid pid 0")
