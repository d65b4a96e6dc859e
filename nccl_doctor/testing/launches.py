"""``--nccl-doctor``: distributed jobs that a test launches as subprocesses run under the doctor.

While such a test runs, ``subprocess.Popen`` rewrites a launch command (torchrun,
``python -m torch.distributed.run``/``.launch``, ``accelerate launch``, deepspeed) into
``python -m nccl_doctor run --quiet --out DIR --hang-after S -- COMMAND``: a hang is called and
the job stopped in seconds, and the test then fails with the diagnosis read from DIR; a crash
is diagnosed there too, for the test's failure. The test sees the process it started: ``args``
its own command, the job's output and exit status (``run`` passes them through; 124 when it
stopped a hang).
"""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any, Sequence

from nccl_doctor.reporters.callpath import path_lines
from nccl_doctor.reporters.escape import visible
from nccl_doctor.words import ranks_text
from nccl_doctor import bounded_json
from nccl_doctor.diagnosis import Finding

_MODULES = ("torch.distributed.run", "torch.distributed.launch", "accelerate.commands.launch",
            "deepspeed.launcher.runner")


def is_launch(argv: Sequence[str]) -> bool:
    if not argv or any("nccl_doctor" in str(a) or "nccl-doctor" in str(a) for a in argv[:6]):
        return False
    head = os.path.basename(str(argv[0]))
    if head in ("torchrun", "deepspeed"):
        return True
    if head == "accelerate" and len(argv) > 1 and argv[1] == "launch":
        return True
    if head.startswith("python"):
        for i, a in enumerate(argv[:-1]):
            if a == "-m" and argv[i + 1] in _MODULES:
                return True
    return False


def _startable(argv: Sequence[str], env: Any, cwd: Any) -> bool:
    """Whether ``argv[0]`` can be started: if not, the command is left as it is, for Popen to
    raise the FileNotFoundError the test would get without the doctor."""
    head = str(argv[0])
    if os.sep in head:
        return os.access(os.path.join(str(cwd or ""), head), os.X_OK)
    path = (env if env is not None else os.environ).get("PATH", os.defpath)
    return shutil.which(head, path=path) is not None


#: the verdicts (report.json) of a launched run that the test's failure is told about
DIAGNOSED = ("hang", "crash")


class Launches:
    """Rewrites launch commands while ``active``; remembers each run's capture directory."""

    def __init__(self, base: Path, hang_after: float) -> None:
        self.base, self.hang_after = base, hang_after
        self.runs: list[Path] = []
        self._original = subprocess.Popen.__init__

    def wrap(self, args: Any, shell: bool, env: Any = None, cwd: Any = None) -> Any:
        out = self.base / f"launch{len(self.runs)}"
        doctor = [sys.executable, "-m", "nccl_doctor", "run", "--quiet", "--force", "--out",
                  str(out), "--hang-after", str(self.hang_after), "--"]
        if shell and isinstance(args, str):
            words = shlex.split(args)
            if not is_launch(words):
                return args
            self.runs.append(out)
            return " ".join(shlex.quote(w) for w in doctor) + " " + args
        if (isinstance(args, (list, tuple)) and is_launch([str(a) for a in args])
                and _startable(args, env, cwd)):
            self.runs.append(out)
            return doctor + [str(a) for a in args]
        return args

    def __enter__(self) -> Launches:
        launches, original = self, self._original

        def __init__(popen: Any, args: Any, *a: Any, **kw: Any) -> None:
            wrapped = launches.wrap(args, bool(kw.get("shell")), kw.get("env"), kw.get("cwd"))
            original(popen, wrapped, *a, **kw)
            # what the test sees of its process (CompletedProcess.args, CalledProcessError.cmd,
            # TimeoutExpired.cmd) is its own command, not the doctor's around it
            popen.args = args

        subprocess.Popen.__init__ = __init__  # type: ignore[method-assign]
        return self

    def __exit__(self, *exc: object) -> None:
        subprocess.Popen.__init__ = self._original  # type: ignore[method-assign]

    def diagnosed(self) -> list[dict]:
        """The report (report.json) of every launched run the doctor diagnosed as hung or
        crashed, in launch order; ``_capture`` names its capture directory."""
        out = []
        for run in self.runs:
            try:
                report = bounded_json.load_file(run / "report.json")
            except (OSError, ValueError):
                continue
            if isinstance(report, dict) and report.get("verdict") in DIAGNOSED:
                report["_capture"] = str(run)
                out.append(report)
        return out


def _what(report: dict) -> str:
    """What became of a launched run, in words."""
    if report.get("verdict", "hang") == "hang":
        return "hung"
    status = report.get("exit_status")
    return f"crashed (exit status {status})" if isinstance(status, int) else "crashed"


def reason(report: dict) -> str:
    """A hang's or a crash's report (report.json) in one line: its root cause."""
    root = next((f for f in report.get("findings", []) if f.get("root_cause")), None)
    hung = report.get("verdict", "hang") == "hang"
    if root is None:
        return ("a job this test launched hung; nccl-doctor stopped it" if hung
                else f"a job this test launched {_what(report)}")
    return visible(f"a job this test launched {'hung' if hung else 'crashed'}: "
                   f"{root.get('kind')}: {root.get('title')}")


def describe(report: dict) -> str:
    """A hang's or a crash's report (report.json) as failure text."""
    stopped = "; it was stopped" if report.get("verdict", "hang") == "hang" else ""
    lines = [f"nccl-doctor: a job this test launched {_what(report)}{stopped}"]
    root = next((f for f in report.get("findings", []) if f.get("root_cause")), None)
    if root is not None:
        lines += [f"ROOT CAUSE {root.get('kind')}: {root.get('title')}", root.get("detail", "")]
        if root.get("callsite"):
            entry = f" (from {root['entry_callsite']})" if root.get("entry_callsite") else ""
            lines.append(f"callsite: {root['callsite']}{entry}")
        finding = Finding.from_json(root)
        if finding is not None and finding.branch_line:
            lines.append(f"branch: {finding.branch_line}")
        frames = finding.call_path if finding is not None else ()
        lines += ["  " + line for line in path_lines(frames)]
        if root.get("hint"):
            lines.append(f"fix: {root['hint']}")
    for c in report.get("stack_classes", []):
        frames = " -> ".join(c.get("frames", [])[-3:])
        who = ranks_text([r for r in c.get("ranks", []) if isinstance(r, int)])
        lines.append(f"{who}: {frames}{'  <- odd one out' if c.get('odd') else ''}")
    w = report.get("watchdog") or {}
    if w:
        lines.append(f"watchdog: {w.get('situation')} diagnosed {w.get('waited_s')} s after the "
                     "last progress")
    return "\n".join(x for x in lines if x)
