"""What the command line imports before it runs a command: only what the command needs.

``nccl-doctor run`` pays for every module its parser imports before the job starts (issue 42:
pandas, through ``export``'s options, cost a run 0.2 s). Each check runs in a fresh interpreter,
since this test process has imported everything already.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

#: Never imported by building the parser: what only other commands, or a run's own work, need.
NOT_FOR_THE_PARSER = ("pandas", "pyarrow", "numpy", "torch", "prometheus_client", "http.server",
                      "jinja2", "rich", "nccl_doctor.serve.server", "nccl_doctor.data.columns",
                      "nccl_doctor.data.job", "nccl_doctor.supervisor.supervisor",
                      "nccl_doctor.supervisor.federation.job", "nccl_doctor.analysis")


def _imported(code: str, names: tuple[str, ...]) -> list[str]:
    """Which of ``names`` are in ``sys.modules`` after running ``code`` in a new interpreter."""
    probe = f"{code}\nimport json, sys\nprint(json.dumps([n for n in {list(names)!r} " \
            "if n in sys.modules]))"
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                         check=True).stdout
    return json.loads(out.splitlines()[-1])


@pytest.mark.parametrize("argv", [["run", "--", "true"], ["replay", "x"], ["export", "x", "-o",
                                                                             "f.csv"],
                                  ["check", "x.py"]])
def test_the_parser_imports_no_command_s_work(argv):
    code = ("from nccl_doctor.cli.main import build_parser\n"
            f"build_parser().parse_args({argv!r})")
    assert _imported(code, NOT_FOR_THE_PARSER) == []


def test_a_command_s_parser_imports_no_other_command():
    code = ("from nccl_doctor.cli.main import build_parser\n"
            "build_parser(['run', '--', 'true']).parse_args(['run', '--', 'true'])")
    others = ("nccl_doctor.cli.demo", "nccl_doctor.reproducers", "nccl_doctor.cli.check",
              "nccl_doctor.cli.export", "nccl_doctor.cli.replay", "nccl_doctor.cli.run")
    assert _imported(code, others) == ["nccl_doctor.cli.run"]
    # no command named (a typo, --help): every command is registered, as the help lists them
    assert _imported("from nccl_doctor.cli.main import build_parser\nbuild_parser(['rnu'])",
                     others) == list(others)


def test_the_probe_sees_an_import():
    assert _imported("import pandas", ("pandas", "numpy")) == ["pandas", "numpy"]
    # (the calls table's columns need pandas only to make a frame: export writes Arrow)
    assert _imported("import nccl_doctor.data.job", ("pandas", "numpy")) == ["numpy"]


def test_export_formats_need_no_pandas():
    assert _imported("from nccl_doctor.data.export import FORMATS, format_for",
                     ("pandas", "pyarrow")) == []


def test_the_reporters_are_imported_when_used():
    assert _imported("import nccl_doctor.reporters", ("jinja2", "rich")) == []
    from nccl_doctor import reporters
    from nccl_doctor.reporters.console import ConsoleReporter
    from nccl_doctor.reporters.html import HtmlReporter
    from nccl_doctor.reporters.json import JsonReporter
    assert reporters.REPORTERS == {"console": ConsoleReporter, "json": JsonReporter,
                                   "html": HtmlReporter}
    assert set(reporters.FORMATS) == set(reporters.REPORTERS)
    assert reporters.HtmlReporter is HtmlReporter
    with pytest.raises(AttributeError, match="no attribute 'Nothing'"):
        reporters.Nothing  # noqa: B018


def test_the_federation_package_hands_out_its_classes_when_asked():
    code = "from nccl_doctor.supervisor.federation import rendezvous, store"
    assert _imported(code, ("nccl_doctor.supervisor.federation.job", "numpy")) == []
    from nccl_doctor.supervisor import federation
    from nccl_doctor.supervisor.federation.job import FederatedJob
    from nccl_doctor.supervisor.federation.node import Federation
    from nccl_doctor.supervisor.federation.rendezvous import Rendezvous
    assert (federation.FederatedJob, federation.Federation, federation.Rendezvous) == \
        (FederatedJob, Federation, Rendezvous)
    with pytest.raises(AttributeError, match="no attribute 'Nothing'"):
        federation.Nothing  # noqa: B018


#: What a run builds while its job's ranks start, never before the launch.
NOT_BEFORE_THE_LAUNCH = ("numpy", "jinja2", "rich", "nccl_doctor.supervisor.supervisor",
                         "nccl_doctor.supervisor.watching", "nccl_doctor.analysis",
                         "nccl_doctor.supervisor.watchdog")


def _at_launch(argv: list[str]) -> dict:
    """Run ``nccl-doctor ARGV`` in a new interpreter; which of NOT_BEFORE_THE_LAUNCH were
    imported when the job was launched, and the run's exit status."""
    probe = f"""
import json, sys
from nccl_doctor.supervisor import launch
seen = []
class Job(launch.Job):
    def __init__(self, *args, **kwargs):
        seen.append([n for n in {list(NOT_BEFORE_THE_LAUNCH)!r} if n in sys.modules])
        super().__init__(*args, **kwargs)
launch.Job = Job
import nccl_doctor.supervisor.start as start
start.Job = Job
from nccl_doctor.cli.main import main
code = main({argv!r})
print(json.dumps({{"seen": seen, "code": code,
                  "after": [n for n in {list(NOT_BEFORE_THE_LAUNCH)!r} if n in sys.modules]}}))
"""
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                         check=True).stdout
    return json.loads(out.splitlines()[-1])


def test_a_run_launches_its_job_before_it_builds_the_supervisor(tmp_path):
    got = _at_launch(["run", "--quiet", "--out", str(tmp_path / "out"), "--", sys.executable,
                      "-c", "raise SystemExit(3)"])
    assert got["seen"] == [[]]  # one launch, with none of them imported yet
    assert got["code"] == 3  # the job's own exit status: the run went on to its end
    assert "nccl_doctor.supervisor.supervisor" in got["after"]  # (the probe sees them)
    assert (tmp_path / "out" / "report.json").is_file()


def test_a_supervisor_that_cannot_be_built_leaves_the_launched_job_to_run(tmp_path):
    done = tmp_path / "done"
    job = [sys.executable, "-c", "import pathlib, sys, time; time.sleep(0.5); "
           f"pathlib.Path({str(done)!r}).write_text('ran'); print('job output'); sys.exit(5)"]
    probe = f"""
import sys
from nccl_doctor.supervisor import supervisor
def broken(self, *args, **kwargs):
    raise RuntimeError("no watches today")
supervisor.Supervisor.__init__ = broken
from nccl_doctor.cli.main import main
sys.exit(main({["run", "--out", str(tmp_path / "out"), "--"] + job!r}))
"""
    run = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                         timeout=60)
    assert run.returncode == 5  # the job's own exit status
    assert done.read_text() == "ran" and run.stdout == "job output\n"
    assert run.stderr.splitlines() == [
        "nccl-doctor: could not watch the job (RuntimeError('no watches today')); it runs on "
        "unwatched"]
    assert not (tmp_path / "out" / ".nccl-doctor.lock").exists()


#: What a rank's recorder never imports: every Python process of a job loads the recorder, and
#: the data model's dataclasses, the analysis and the GPU and stack readers are the doctor's
NOT_FOR_A_RANK = ("nccl_doctor.model", "nccl_doctor.location", "nccl_doctor.analysis",
                  "nccl_doctor.gpu.series", "nccl_doctor.stacks.samples",
                  "nccl_doctor.capture.manifest", "importlib.metadata", "numpy")


def test_a_rank_s_recorder_imports_none_of_the_doctor_s_model():
    code = ("from nccl_doctor.rank.recorder.core import Recorder\n"
            "from nccl_doctor.rank import bootstrap, early_exit, hooks\n"
            "hooks.install  # (the hooks the recorder installs at torch's import)\n"
            "bootstrap.integrations()\n")
    assert _imported(code, NOT_FOR_A_RANK) == []
    # (the probe sees them where a reader is used)
    assert _imported("from nccl_doctor.capture import early_exit\nearly_exit._location("
                     "{'path': 'a.py', 'line': 1})", ("nccl_doctor.location",)) \
        == ["nccl_doctor.location"]


def _threads_after(code: str) -> int:
    """The threads of a new interpreter once ``code`` ran (numpy's BLAS starts its own)."""
    probe = f"{code}\nimport os\nprint(len(os.listdir('/proc/self/task')))"
    env = {k: v for k, v in os.environ.items()
           if k not in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS")}
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                         check=True, env=env).stdout
    return int(out.splitlines()[-1])


def test_a_run_imports_numpy_with_one_blas_thread_and_leaves_the_environment_as_it_was():
    same = ("import os\nfrom nccl_doctor import blas\nbefore = dict(os.environ)\n"
            "blas.import_numpy()\nassert dict(os.environ) == before, 'changed'")
    assert _threads_after(same) == 1
    if (os.cpu_count() or 1) > 1:  # (the control: numpy as the job would import it)
        assert _threads_after("import numpy") > 1


def test_the_reaper_starts_with_the_interpreter_s_own_modules(tmp_path):
    """Every run starts a reaper (supervisor/reaper.py): as ``Reaper`` starts it (no ``site``),
    it reads its pipe and exits on ``done`` having imported none of what a supervisor's loss
    needs (psutil, pathlib), nor typing or subprocess; nccl_doctor is found all the same."""
    from nccl_doctor.supervisor import reaper

    probe = reaper._MAIN.replace(
        "sys.exit(reaper.main(sys.argv[1:]))",
        "code = reaper.main(sys.argv[1:]); "
        "print(sorted(m for m in ('site', 'psutil', 'pathlib', 'typing', 'subprocess', "
        "'nccl_doctor.env') if m in sys.modules), code)")
    env = {**os.environ, "PYTHONPATH": reaper._own_path()}
    out = subprocess.run([sys.executable, "-S", "-c", probe, str(tmp_path), "-"], env=env,
                         input="job 1\ndone\n", capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["['nccl_doctor.env']", "0"]
