"""The pytest plugin, through pytester: distributed tests that deadlock, mismatch, fail on one
rank or pass, run as a user's test suite would."""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET

import pytest

pytest_plugins = ["pytester"]
pytestmark = pytest.mark.integration

TESTS = '''
import pytest
import torch
import torch.distributed as dist


@pytest.mark.distributed(world_size=2, timeout=60)
def test_clean():
    t = torch.ones(3) * (dist.get_rank() + 1)
    dist.all_reduce(t)
    assert t.tolist() == [3.0, 3.0, 3.0]


@pytest.mark.distributed(world_size=3, timeout=60)
def test_deadlock():
    t = torch.ones(4)
    dist.all_reduce(t)
    if dist.get_rank() != 2:  # rank 2 skips the broadcast
        dist.broadcast(t, src=0)
    dist.all_reduce(t)


@pytest.mark.distributed(world_size=2, timeout=60)
def test_shapes():
    t = torch.ones(2, 5 + dist.get_rank())
    out = [torch.empty_like(t) for _ in range(2)]
    dist.all_gather(out, t)


@pytest.mark.distributed(world_size=2, timeout=60)
def test_assert_on_rank_1():
    assert dist.get_rank() != 1, "rank 1 disagrees"


@pytest.mark.distributed(world_size=2, timeout=60)
def test_collectives_fixture(collectives):
    dist.all_reduce(torch.ones(1))
    dist.broadcast(torch.ones(1), src=0)
    dist.barrier()
    assert collectives.ops() == ["all_reduce", "broadcast", "barrier"]
    assert collectives.counts()["broadcast"] == 1
    assert collectives.by_rank() == {0: collectives.ops(), 1: collectives.ops()}
    collectives.assert_no_desync()


@pytest.mark.parametrize("n", [1, 4])
@pytest.mark.distributed(world_size=2, timeout=60)
def test_with_fixture_and_params(tmp_path, n):
    (tmp_path / f"rank{dist.get_rank()}").write_text(str(n))
    t = torch.tensor([float(n)])
    dist.all_reduce(t)
    assert t.item() == 2 * n
'''


def failure_of(out: str, name: str) -> str:
    """The failure text pytest printed for test ``name``: from its header to the next one."""
    start = out.index(f"_ {name} _")
    end = re.compile(r"\n_{3,} \S+ _{3,}\n|\n=+ short test summary info =+\n")
    found = end.search(out, start + 1)
    return out[start:found.start() if found else len(out)]


#: a frame of nccl-doctor's own (its worker, the recorder's wrappers) in a printed traceback
OWN_FRAME = re.compile(r'File "[^"]*/nccl_doctor/')


@pytest.fixture(params=["serial", "xdist"])
def outcome(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, request):
    pytester.makepyfile(test_dist=TESTS)
    monkeypatch.setenv("COLUMNS", "400")  # the short summary's reasons are not cut to the width
    extra = ["-p", "xdist", "-n", "2"] if request.param == "xdist" else []
    return pytester.runpytest_subprocess("-p", "no:cacheprovider", "-rA", "--junitxml=junit.xml",
                                         *extra, timeout=600)


def test_plugin_diagnoses_and_passes(outcome, pytester: pytest.Pytester):
    out = outcome.stdout.str()
    counts = outcome.parseoutcomes()
    # a diagnosed distributed test is a failed test: counted, listed and exited as pytest's own
    assert counts == {"passed": 4, "failed": 3}, out[-3000:]
    assert outcome.ret == pytest.ExitCode.TESTS_FAILED
    # each one line in the short summary, with its root cause as the reason
    summary = out[out.index("= short test summary info ="):]
    assert re.search(r"^FAILED test_dist\.py::test_deadlock - collective_mismatch: "
                     r"all_reduce / broadcast #2 of group 0: ops differ", summary, re.M), summary
    assert re.search(r"^FAILED test_dist\.py::test_shapes - collective_mismatch: all_gather #1 "
                     r"of group 0: shapes differ \(rank 0: float32\[2,5\]; rank 1: "
                     r"float32\[2,6\]\)$", summary, re.M), summary
    assert re.search(r"^FAILED test_dist\.py::test_assert_on_rank_1 - rank_exited: rank 1 raised "
                     r"AssertionError: rank 1 disagrees at test_dist\.py:\d+$", summary, re.M), \
        summary
    assert summary.count("FAILED ") == 3 and "DIAGNOSED" not in out
    # a deadlock fails within its timeout, naming the rank that skipped the broadcast
    deadlock = failure_of(out, "test_deadlock")
    assert "ROOT CAUSE" in deadlock and "rank 2" in deadlock
    assert "broadcast" in deadlock and "test_dist.py:" in deadlock
    # a shape mismatch names both shapes
    shapes = failure_of(out, "test_shapes")
    assert "float32[2,5]" in shapes and "float32[2,6]" in shapes
    # an assertion on one rank shows that rank's traceback, and only that rank's; the fix is
    # the test's, not a launcher's
    failed_rank = failure_of(out, "test_assert_on_rank_1")
    assert "--- rank 1 ---" in failed_rank and "rank 1 disagrees" in failed_rank
    assert "--- rank 0 ---" not in failed_rank
    # once: in the failure, not again in the ranks' captured stderr
    assert failed_rank.count("Traceback (most recent call last)") == 1, failed_rank
    assert ("fix: The assertion failed on rank 1: fix the test or the code under test"
            in " ".join(failed_rank.split())), failed_rank
    assert "max-restarts" not in out and "torchrun" not in out
    # each failure: the diagnosis once, its capture named once (its nccl-doctor section), and
    # the ranks' tracebacks are the test's only
    for name in ("test_deadlock", "test_shapes", "test_assert_on_rank_1"):
        failure = failure_of(out, name)
        assert failure.count("ROOT CAUSE") == 1, failure
        assert failure.count("(nccl-doctor replay it)") == 1, failure
        assert re.search(r"^-+ nccl-doctor -+\ncapture: \S+ \(nccl-doctor replay it\)$",
                         failure, re.M), failure
    assert "test_assert_on_rank_1" in out and not OWN_FRAME.search(out), OWN_FRAME.findall(out)
    for name in ("test_clean", "test_collectives_fixture", "test_with_fixture_and_params[1]",
                 "test_with_fixture_and_params[4]"):
        assert f"PASSED test_dist.py::{name}" in out
    # JUnit XML: the root cause is the failure's message, the diagnosis its text
    suite = ET.parse(pytester.path / "junit.xml").getroot().find("testsuite")
    assert suite is not None and suite.get("failures") == "3" and suite.get("tests") == "7"
    failures = {case.get("name"): case.find("failure") for case in suite.iter("testcase")}
    assert sorted(n for n, f in failures.items() if f is not None) == [
        "test_assert_on_rank_1", "test_deadlock", "test_shapes"]
    for name in ("test_deadlock", "test_shapes", "test_assert_on_rank_1"):
        failure = failures[name]
        reason = re.search(rf"^FAILED test_dist\.py::{name} - (.*)$", summary, re.M)
        assert reason is not None and failure.get("message") == reason.group(1)
        assert "ROOT CAUSE" in failure.text and "(nccl-doctor replay it)" in failure.text
        case = next(c for c in suite.iter("testcase") if c.get("name") == name)
        assert ("nccl_doctor", "diagnosed") in [(p.get("name"), p.get("value"))
                                                for p in case.iter("property")]
    assert failures["test_assert_on_rank_1"].get("message").startswith(
        "rank_exited: rank 1 raised AssertionError: rank 1 disagrees at test_dist.py:")


def test_only_the_failures_with_rf(pytester: pytest.Pytester):
    """``-rf``: the short summary lists the distributed tests that failed, each with its reason;
    ``grep FAILED`` finds them."""
    pytester.makepyfile(test_dist=TESTS)
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "-q", "-rf",
                                           "-k", "shapes or assert or clean", timeout=600)
    lines = [line for line in result.outlines if line.startswith("FAILED ")]
    assert [line.split(" - ")[0] for line in lines] == [
        "FAILED test_dist.py::test_shapes", "FAILED test_dist.py::test_assert_on_rank_1"], \
        result.stdout.str()[-3000:]
    assert lines[0].split(" - ", 1)[1].startswith("collective_mismatch: ")
    assert lines[1].split(" - ", 1)[1].startswith("rank_exited: rank 1 raised")
    assert result.parseoutcomes() == {"failed": 2, "passed": 1, "deselected": 4}
    assert result.ret == pytest.ExitCode.TESTS_FAILED


LAUNCHING = '''
import os, subprocess, sys

def test_launches_a_hanging_job():
    proc = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone",
                           "--nproc-per-node=3", JOB], env=dict(os.environ, SKIPPER="1"),
                          timeout=240)
    assert proc.returncode == 0

def test_launches_a_clean_job():
    proc = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone",
                           "--nproc-per-node=2", CLEAN], timeout=240)
    assert proc.returncode == 0
'''


def test_nccl_doctor_option_catches_a_hanging_torchrun(pytester: pytest.Pytester,
                                                       monkeypatch: pytest.MonkeyPatch):
    from pathlib import Path

    monkeypatch.setenv("COLUMNS", "400")

    jobs = Path(__file__).parent.parent / "integration" / "jobs"
    pytester.makepyfile(test_launch=f"JOB = {str(jobs / 'skip_broadcast.py')!r}\n"
                                    f"CLEAN = {str(jobs / 'clean.py')!r}\n" + LAUNCHING)
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "-rA", "--nccl-doctor",
                                           timeout=600)
    out = result.stdout.str()
    assert result.parseoutcomes() == {"passed": 1, "failed": 1}, out[-3000:]
    assert re.search(r"^FAILED test_launch\.py::test_launches_a_hanging_job - a job this test "
                     r"launched hung: \w+: ", out, re.M), out[-3000:]
    hang = failure_of(out, "test_launches_a_hanging_job")
    assert "a job this test launched hung" in hang and "ROOT CAUSE" in hang
    assert "skip_broadcast.py" in hang and "rank 1" in hang
    assert hang.count("ROOT CAUSE") == 1  # the diagnosis once; the section only names the capture
    assert hang.count("(nccl-doctor replay it)") == 1 and "hang: " in hang
    # without the option the plugin leaves subprocesses alone (the hang would block): the ini
    # switch is read too
    pytester.makeini("[pytest]\nnccl_doctor = true\n")
    again = pytester.runpytest_subprocess("-p", "no:cacheprovider", "-k", "clean", timeout=600)
    assert again.parseoutcomes().get("passed") == 1


CRASHING = '''
import json, os, subprocess, sys

import pytest
import torch.distributed as dist

COMMAND = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2",
           JOB]


def launch(tmp_path):
    proc = subprocess.run(COMMAND, env=dict(os.environ, END="raise", SEEN=str(tmp_path)),
                          capture_output=True, text=True, timeout=240)
    return proc


def test_launches_a_crashing_job(tmp_path):
    proc = launch(tmp_path)
    with open(SEEN, "w") as f:  # what the test saw of its process
        json.dump({"args": proc.args, "returncode": proc.returncode, "stdout": proc.stdout,
                   "stderr": proc.stderr}, f)
    assert proc.returncode == 0


def test_expects_the_crash(tmp_path):
    assert launch(tmp_path).returncode != 0


@pytest.mark.distributed(world_size=2, timeout=60)
def test_assert_on_rank_1():
    assert dist.get_rank() != 1, "rank 1 disagrees with rank 0 about the sum"
'''


@pytest.mark.parametrize("mode", ["serial", "xdist"])
def test_nccl_doctor_option_diagnoses_a_crashing_torchrun(
        mode: str, pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch):
    """A job a test launches that crashes (one rank raises) fails the test, when it fails, with
    the diagnosis after its own traceback, and the capture is kept; the test sees its process
    as without the doctor (its command, its exit status, its output). Under pytest-xdist the
    failure text is the same: not hard-wrapped at the 80 columns of a worker's environment."""
    import json
    from pathlib import Path

    monkeypatch.delenv("COLUMNS", raising=False)  # a pipe, no width: no line is wrapped
    monkeypatch.setenv("CI", "true")  # the short summary's reasons are not cut (pytest's rule)
    job = Path(__file__).parent.parent / "integration" / "jobs" / "ends.py"
    seen = pytester.path / "seen.json"
    pytester.makepyfile(test_launch=f"JOB = {str(job)!r}\nSEEN = {str(seen)!r}\n" + CRASHING)
    extra = ["-p", "xdist", "-n", "2"] if mode == "xdist" else []
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "-rA", "--nccl-doctor",
                                           "--nccl-doctor-keep=kept", "--junitxml=junit.xml",
                                           *extra, timeout=600)
    out = result.stdout.str()
    assert result.parseoutcomes() == {"passed": 1, "failed": 2}, out[-3000:]
    # what the test saw: its own command, the job's exit status (torchrun's 1) and output
    saw = json.loads(seen.read_text())
    assert saw["args"][1:] == ["-m", "torch.distributed.run", "--standalone",
                               "--nproc-per-node=2", str(job)], saw["args"]
    assert saw["returncode"] == 1
    assert "rank 1 says hello" in saw["stdout"] and "nccl_doctor" not in saw["stdout"]
    assert "ValueError: rank 1 gives up" in saw["stderr"] and "ChildFailedError" in saw["stderr"]
    # the failure: the test's own assertion, then the diagnosis naming the rank, the error and
    # its line, then the kept capture; one line in the short summary with the root cause
    line = 1 + job.read_text().splitlines().index('                raise ValueError("rank 1 '
                                                   'gives up")')
    title = (f"rank_exited: rank 1 raised ValueError: rank 1 gives up at {job}:{line} while its "
             "peers still needed it")
    assert (f"FAILED test_launch.py::test_launches_a_crashing_job - a job this test launched "
            f"crashed: {title}") in result.outlines, out[-3000:]
    crash = failure_of(out, "test_launches_a_crashing_job")
    assert "assert 1 == 0" in crash and "nccl-doctor: a job this test launched crashed" in crash
    assert crash.index("assert 1 == 0") < crash.index("ROOT CAUSE")
    # a line longer than 80 columns, whole (under xdist as well)
    long_line = f"ROOT CAUSE {title}"
    assert len(long_line) > 80 and long_line in crash.splitlines(), crash
    assert crash.count("ROOT CAUSE") == 1 and crash.count("(nccl-doctor replay it)") == 1
    kept = re.search(r"^crash: (\S+) \(nccl-doctor replay it\)$", crash, re.M)
    assert kept is not None, crash
    assert Path(kept.group(1)).parent == pytester.path / "kept"
    assert (Path(kept.group(1)) / "report.json").is_file()
    assert "PASSED test_launch.py::test_expects_the_crash" in out
    assert sorted(p.name for p in (pytester.path / "kept").iterdir()) == [
        "test_launch.py_test_assert_on_rank_1", "test_launch.py_test_launches_a_crashing_job"]
    # a distributed test's diagnosis too is laid out for pytest's terminal, not a worker's
    failed_rank = failure_of(out, "test_assert_on_rank_1")
    fix = re.search(r"^ROOT CAUSE rank_exited: rank 1 raised AssertionError: rank 1 disagrees "
                    r"with rank 0 about the sum at test_launch\.py:\d+$", failed_rank, re.M)
    assert fix is not None and len(fix.group(0)) > 80, failed_rank
    # JUnit XML: the root cause is the message, the same unwrapped text the body
    suite = ET.parse(pytester.path / "junit.xml").getroot().find("testsuite")
    assert suite is not None
    cases = {case.get("name"): case for case in suite.iter("testcase")}
    failure = cases["test_launches_a_crashing_job"].find("failure")
    assert failure is not None
    assert failure.get("message") == f"a job this test launched crashed: {title}"
    assert long_line in failure.text.splitlines(), failure.text
    assert kept.group(0) in failure.text
    assert fix.group(0) in cases["test_assert_on_rank_1"].find("failure").text
    assert ("nccl_doctor", "diagnosed") in [
        (p.get("name"), p.get("value"))
        for p in cases["test_launches_a_crashing_job"].iter("property")]
