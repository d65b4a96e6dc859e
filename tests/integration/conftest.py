"""Run real multi-process gloo jobs under the doctor (on CPU, launched by the pytest plugin's
launcher nccl_doctor/testing/spawn.py, its ranks forked by this test process's fork server
(nccl_doctor/testing/zygote.py: no torch import per rank), or by torchrun where the launcher is
the subject); the stopped hangs several test files look at, run once per test session
(``stopped_hang``)."""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass, field, replace
from pathlib import Path

import pytest

from nccl_doctor.diagnosis import Diagnosis
from nccl_doctor.supervisor.policy import HangPolicy
from nccl_doctor.supervisor.supervisor import RunResult, Supervisor
from nccl_doctor.testing.spawn import command as spawn_command

JOBS = Path(__file__).parent / "jobs"



@dataclass
class JobRun:
    exit_status: int
    diagnosis: Diagnosis
    out: Path


def own_home(out: Path) -> str:
    """A home directory of the test's own, beside ``out`` (made here): for node doctors, which
    make and share the user's default federation key there (``~/.nccl-doctor``) - a test never
    writes the real one."""
    home = out.parent / "home"
    home.mkdir(exist_ok=True)
    return str(home)


def torchrun(nproc: int, *target: str) -> list[str]:
    return [sys.executable, "-m", "torch.distributed.run", "--standalone",
            f"--nproc-per-node={nproc}", *target]


def spawn(nproc: int, *target: str) -> list[str]:
    """The command starting ``nproc`` ranks of ``target`` as torchrun would, without torchrun's
    own process (nccl_doctor/testing/spawn.py), the ranks forked by the fork server: for the
    tests whose subject is not the launcher (``NCCL_DOCTOR_FORK_SERVER=0``: fresh ranks)."""
    return spawn_command(nproc, list(target))


@pytest.fixture
def run_job(tmp_path: Path):
    def run(nproc: int, *target: str, env: dict[str, str] | None = None) -> JobRun:
        import os

        out = tmp_path / "capture"
        environ = dict(os.environ, **(env or {}))
        result = Supervisor(spawn(nproc, *target), out, environ=environ).run()
        assert result.analysis_error is None, result.analysis_error
        assert result.diagnosis is not None
        assert_window_agrees(out)
        assert_data_agrees(out, tmp_path / "export")
        return JobRun(result.exit_status, result.diagnosis, out)

    return run



def assert_window_agrees(out: Path) -> None:
    """Replayed with a window forced (capture/window.py: a few records around each group's
    first divergence and each rank's newest ones, as a large job is replayed), the job's report
    says what it says on every record: the same findings and ranks (only the straggler pass,
    which reads timing over the whole run, the step_skew pass, which names the first skewed call
    it reads, and the window's own note may differ)."""
    from nccl_doctor.analysis import analyze
    from nccl_doctor.analysis.calls.loaded import load_capture_dir
    from nccl_doctor.capture.window import Size

    def report(**window) -> dict:
        d = analyze(load_capture_dir(out, **window)).to_json()
        stragglers = [f for f in d["findings"] if f["kind"] in ("straggler", "step_skew")]
        d["findings"] = [f for f in d["findings"] if f not in stragglers]
        # (the straggler pass's note on what it could not compare counts the whole run's
        # collectives, as its findings read timing over the whole run)
        # (nor can a window, whose records are not all neighbours, see every unrecorded call)
        d["notes"] = [n for n in d["notes"] if "records compared across" not in n
                      and not n.startswith("stragglers:") and "that were not recorded:" not in n
                      and "that was not recorded:" not in n]
        d.pop("details", None)  # (the unrecorded calls of a healthy run: the same reason)
        if stragglers:
            d.pop("root_cause", None)
            d.pop("verdict", None)
        return d

    full = report()
    windowed = report(window=Size(above=0, tails=0, tail=8))
    if "verdict" not in full:  # (a straggler warning: the window may keep too little to see it)
        windowed.pop("verdict", None)
        windowed.pop("root_cause", None)
    assert windowed == full


def replay_calls(out: Path):
    """The calls table made from what ``replay`` reads (each rank's typed events, one Python
    step per call): the reference ``nccl_doctor.open(out).calls`` (made from the captures as
    columns) must equal row for row."""
    from nccl_doctor.analysis.calls.loaded import load
    from nccl_doctor.data import columns
    from nccl_doctor.model import EventSource

    traces = load(out)
    cats = columns.categories()
    parts = []
    for _, trace in sorted(traces.ranks.items()):
        recorded = tuple(e for e in trace.events if e.source is not EventSource.FLIGHT_RECORDER)
        parts.append(columns.trace_columns(replace(trace, events=recorded), cats,
                                           job_end=job_end(Path(trace.path).parent)))
    return columns.frame(parts, cats)


def job_end(directory: Path) -> tuple[int, ...]:
    """When the job of capture ``directory`` was stopped and ended (ns), read here from its
    watchdog.json and manifest: where ``waited_s`` of a call never returned ends
    (nccl_doctor/data/columns.py rank_end)."""
    from nccl_doctor.capture.manifest import read_manifest
    from nccl_doctor.capture.watch_record import read_watch_log

    if not directory.is_dir():
        return ()
    watch, manifest = read_watch_log(directory), read_manifest(directory)
    times = (watch.stopped_at if watch is not None else None,
             manifest.ended_at if manifest is not None else None)
    return tuple(round(t * 1e9) for t in times if t is not None)


def plain(frame):
    """``frame`` with its categorical columns as plain values (categories' order aside)."""
    from nccl_doctor.data.columns import TEXT
    return frame.astype({c: object for c in TEXT if c in frame})


def assert_data_agrees(out: Path, scratch: Path) -> None:
    """``nccl_doctor.open(out).calls`` equals what replay reads, row for row; ``export`` of it
    (Parquet a rank per row group, and CSV) reads back the same."""
    import pandas as pd
    import pyarrow.parquet as pq

    import nccl_doctor
    from nccl_doctor.data import export

    job = nccl_doctor.open(out)
    calls = job.calls
    pd.testing.assert_frame_equal(plain(calls), plain(replay_calls(out)))
    assert set(calls["rank"]) <= set(job.traces.ranks)
    scratch.mkdir(parents=True, exist_ok=True)
    table = scratch / "calls.parquet"
    assert export.write(job.iter_calls(ranks_per_chunk=1), table, "parquet") == len(calls)
    back = pq.read_table(table)
    assert back.num_rows == len(calls) and back.column_names == list(calls.columns)
    pd.testing.assert_frame_equal(plain(back.to_pandas()), plain(calls))
    csv = scratch / "calls.csv"
    assert export.write(job.iter_calls(), csv, "csv") == len(calls)
    read = pd.read_csv(csv)
    assert list(read.columns) == list(calls.columns) and len(read) == len(calls)
    assert read["seq"].tolist() == calls["seq"].tolist()


@pytest.fixture(name="data_check")
def _data_check():
    """(``replay_calls``, ``plain``) for test files (a conftest is not imported)."""
    return replay_calls, plain


@pytest.fixture
def launch():
    """``launch(nproc, *target)``: the command line starting a job's ranks (``spawn``)."""
    return spawn


# -- what the supervisor reads and writes in its capture directory ------------------------------

_AUDITS: list[DirectoryAudit] = []  # (an audit hook cannot be removed: it looks here)


def _audit_hook(event: str, args: tuple) -> None:
    if _AUDITS and event in ("open", "os.rename"):
        for audit in list(_AUDITS):
            audit.saw(event, args)


class DirectoryAudit:
    """Every open and rename under the supervisor's --out by this process, and the phase of the
    run it came in (``post mortem``: from the analysis of the ended job on)."""

    def __init__(self, sup: Supervisor) -> None:
        self.out = str(sup.out_dir)
        self.phase = "running"
        self.reads: list[tuple[str, str]] = []  # (phase, path relative to --out)
        self.writes: dict[str, list[str]] = {}  # file -> the text of each write, in order
        self._busy = False
        analyse = sup._analyse

        def marked(manifest):
            self.phase = "post mortem"
            return analyse(manifest)

        sup._analyse = marked

    def saw(self, event: str, args: tuple) -> None:
        if self._busy or not args or not isinstance(args[0], (str, bytes, os.PathLike)):
            return
        path = os.fsdecode(args[0])
        if event == "os.rename":  # write_atomic: a finished file replaced in one step
            target = os.fsdecode(args[1])
            if target.startswith(self.out + os.sep):
                self._busy = True
                try:
                    text = Path(path).read_text()
                finally:
                    self._busy = False
                self.writes.setdefault(os.path.relpath(target, self.out), []).append(text)
            return
        if not path.startswith(self.out + os.sep):
            return
        mode, flags = args[1], args[2] if len(args) > 2 else 0
        writing = (any(c in mode for c in "wax+") if isinstance(mode, str)
                   else bool(flags & (os.O_WRONLY | os.O_RDWR | os.O_CREAT)))
        if not writing:
            self.reads.append((self.phase, os.path.relpath(path, self.out)))

    def assert_once(self) -> None:
        """The supervisor read back no file it wrote (manifest, reports, its evidence, GPU and
        straggler samples) at any time; once the job ended it opened no capture (its followers
        held them); and each file it wrote was written only when what it says changed."""
        own = ("manifest.json", "report.json", "report.html", "watchdog.json", "stacks.json",
               "gpu.jsonl", "stragglers.jsonl", "flight_recorder")
        read_back = [r for r in self.reads if r[1].split(os.sep)[0] in own]
        assert not read_back, f"read back what it wrote: {read_back}"
        late = [path for phase, path in self.reads
                if phase == "post mortem" and path.endswith(".ndcap")]
        assert not late, f"captures read again after the job ended: {late}"
        assert len(self.writes.get("manifest.json", [])) == 2  # its start, its end
        for name, texts in self.writes.items():
            same = [i for i in range(1, len(texts)) if texts[i] == texts[i - 1]]
            assert not same, f"{name} written again unchanged (writes {same} of {len(texts)})"
        assert "report.json" in self.writes and "watchdog.json" in self.writes

    def __enter__(self) -> DirectoryAudit:
        _AUDITS.append(self)
        return self

    def __exit__(self, *_exc: object) -> None:
        _AUDITS.remove(self)


sys.addaudithook(_audit_hook)


#: The stopped hangs the watchdog's, the replay's and the audit's tests all look at:
#: (launcher, ranks, job, environment); the skipped broadcast under torchrun, whose workers
#: each run in a session of their own (the stop reaches them as ranks the supervisor adopted).
STOPPED_HANGS = {
    "skip_broadcast": (torchrun, 3, "skip_broadcast.py", {"SKIPPER": "1"}),
    "ddp_uneven": (spawn, 2, "ddp_uneven.py", {}),
}


@dataclass
class StoppedHang:
    """One real hung job under the default policy (the watchdog calls it and stops the job),
    run with its capture directory audited."""

    sup: Supervisor
    result: RunResult
    audit: DirectoryAudit
    messages: list[str] = field(default_factory=list)  # the watchdog's events, status changes


def watch(command: list[str], out: Path, env: dict[str, str] | None = None,
          policy: HangPolicy | None = None) -> tuple[Supervisor, list[str]]:
    """A supervisor of ``command`` (the default hang policy unless ``policy``), and the list it
    fills with the watchdog's events and each change of its status."""
    messages: list[str] = []
    sup = Supervisor(command, out, environ=dict(os.environ, **(env or {})),
                     policy=policy or HangPolicy(), announce=messages.append)

    def status(s: Supervisor) -> None:
        message = s.view().message
        if message and (not messages or messages[-1] != message):
            messages.append(message)

    sup.attach(status)
    return sup, messages


@pytest.fixture
def watched():
    """``watch`` for test files (a conftest is not imported)."""
    return watch


@pytest.fixture(scope="session")
def stopped_hang(tmp_path_factory):
    """``stopped_hang(name)``: the run of ``STOPPED_HANGS[name]``, made once per session (a
    test that changes its directory works on a copy). The files of the tests using it share a
    worker (tests/conftest.py ``SHARED``)."""
    runs: dict[str, StoppedHang] = {}

    def get(name: str) -> StoppedHang:
        if name not in runs:
            launcher, nproc, script, env = STOPPED_HANGS[name]
            sup, messages = watch(launcher(nproc, str(JOBS / script)),
                                  tmp_path_factory.mktemp(name) / "out", env)
            with DirectoryAudit(sup) as audit:
                result = sup.run()
            runs[name] = StoppedHang(sup, result, audit, messages)
        return runs[name]

    return get
