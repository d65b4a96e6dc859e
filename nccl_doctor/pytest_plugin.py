"""pytest plugin (entry point ``pytest11``): distributed tests fail with a diagnosis instead of
hanging CI.

``--nccl-doctor`` (ini: ``nccl_doctor = true``): every torchrun / ``python -m
torch.distributed.run`` / ``accelerate launch`` / deepspeed subprocess a test starts runs under
the doctor (``--nccl-doctor-hang-after``, default 60 s); a hang there is stopped in seconds and
fails the test with the diagnosis. A crash of such a job is diagnosed too: a test that then fails
(on its own: the test decides whether a crash is a failure) shows the diagnosis after its own
traceback, and its capture is kept. The test sees its process as without the doctor: ``args``,
output, the job's exit status (124 when the doctor stopped a hang).

A test failed with a diagnosis is a failed test, as pytest's own: counted as ``failed``, listed
``FAILED path::test - <root cause>`` in the short summary, the diagnosis its failure text and the
root cause its ``message`` in JUnit XML (with the property ``nccl_doctor=diagnosed``); the
capture's path in the failure's ``nccl-doctor`` section.

The failure text is laid out to the width of the terminal pytest runs in (``COLUMNS`` first), or
not wrapped at all on a pipe or a file; pytest-xdist's workers are told the width pytest's own
process chose (theirs have no terminal, and inherit the ``COLUMNS=80`` that importing readline
writes into the controller's C environment, unseen by its ``os.environ``).

The capture of a failed test is kept where pytest's temporary directories (which rotate away
after three runs) do not reach: ``--nccl-doctor-keep DIR`` (ini: ``nccl_doctor_keep``), by default
``.pytest_cache/d/nccl-doctor`` under the rootdir, one directory per test (the last failure of
each test; without the cache plugin the temporary directory is named instead).

``@pytest.mark.distributed(world_size=2, timeout=120, backend="gloo")`` runs the test function
in ``world_size`` processes with torch.distributed initialised (testing/spawn.py, a free port),
under the recorder and the watchdog. A deadlock, a mismatch, a crash of any rank or the timeout
fails the test with the diagnosis as its failure text and an ``nccl-doctor`` report section; an
assertion error on any rank shows that rank's traceback. A passing test passes quietly.

The ranks are forked by a fork server (testing/zygote.py: one per pytest process or xdist worker,
started when the session collects a distributed test, stopped at its end) that has imported torch
and the recorder already: a rank starts in milliseconds, not the second and more of a fresh
process importing torch. Each forked rank is what a fresh ``python`` would be under the doctor
(its environment, recorder, capture, pid, stdio, exit status). ``NCCL_DOCTOR_FORK_SERVER=0``
starts every rank fresh; so does a platform other than Linux, or CUDA initialised in the server.
"""

from __future__ import annotations

from pathlib import Path

import pytest

MARKER = "distributed"
DEFAULTS = {"world_size": 2, "timeout": 120.0, "backend": "gloo"}
PROPERTY = "nccl_doctor"  # user property set on a report the doctor failed (survives xdist)
DEFAULT_HANG_AFTER = 60.0
#: the width a failure text is laid out for when it is not wrapped (a pipe, a file)
NO_WRAP = 1 << 16
_WIDTH_INPUT = "nccl_doctor_width"  # the controller's width, in an xdist worker's workerinput


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("nccl-doctor")
    group.addoption("--nccl-doctor", action="store_true", default=None,
                    help="run every distributed job a test launches as a subprocess (torchrun, "
                         "python -m torch.distributed.run, accelerate launch, deepspeed) under "
                         "nccl-doctor: a hang fails the test with the diagnosis, a crash is "
                         "diagnosed in the test's failure")
    group.addoption("--nccl-doctor-hang-after", type=float, default=None, metavar="SECONDS",
                    help=f"for those jobs: any wait past this is a hang (default "
                         f"{DEFAULT_HANG_AFTER:.0f}); certain deadlocks are called in seconds")
    group.addoption("--nccl-doctor-keep", default=None, metavar="DIR",
                    help="where the captures of failed tests are kept, one directory per test "
                         "(default: .pytest_cache/d/nccl-doctor)")
    group.addoption("--nccl-doctor-user-code", action="append", default=None, metavar="PATTERN",
                    help="files matching PATTERN are your code even if installed (as `nccl-doctor "
                         "run --user-code`); repeatable")
    group.addoption("--nccl-doctor-library-code", action="append", default=None,
                    metavar="PATTERN",
                    help="files matching PATTERN are library code (as `nccl-doctor run "
                         "--library-code`); repeatable")
    parser.addini("nccl_doctor", type="bool", default=False,
                  help="the same as --nccl-doctor")
    parser.addini("nccl_doctor_user_code", type="linelist", default=[],
                  help="the same as --nccl-doctor-user-code, a pattern a line")
    parser.addini("nccl_doctor_library_code", type="linelist", default=[],
                  help="the same as --nccl-doctor-library-code, a pattern a line")
    parser.addini("nccl_doctor_keep", default="",
                  help="the same as --nccl-doctor-keep")


def _launches_enabled(config: pytest.Config) -> bool:
    option = config.getoption("--nccl-doctor")
    return bool(option if option is not None else config.getini("nccl_doctor"))


@pytest.fixture(autouse=True)
def _nccl_doctor_launches(request: pytest.FixtureRequest):
    if not _launches_enabled(request.config) or request.node.get_closest_marker(MARKER):
        yield None
        return
    from nccl_doctor.testing.launches import Launches

    hang_after = request.config.getoption("--nccl-doctor-hang-after") or DEFAULT_HANG_AFTER
    base = Path(request.config._tmp_path_factory.mktemp("nccl-doctor-launch", numbered=True))
    with Launches(base, hang_after) as launches:
        request.node.stash[_LAUNCHES] = launches
        yield launches


_LAUNCHES = pytest.StashKey()


class DistributedFailure(pytest.fail.Exception):
    """A distributed test failed: ``text`` (the diagnosis, the ranks' tracebacks), ``reason``
    (its one line: the root cause), ``section`` (where the capture is kept)."""

    def __init__(self, text: str, reason: str, section: str = "") -> None:
        super().__init__(text, pytrace=False)
        self.text, self.reason, self.section = text, reason, section


def failure_repr(item: pytest.Item, text: str, reason: str, section: str = ""):
    """A failure as pytest's own are reported: ``reason`` is the crash message (the short
    summary's ``FAILED test - reason``, the JUnit ``message``), ``text`` the long repr, and
    ``section`` an ``nccl-doctor`` section of it (in the terminal and the JUnit text alike);
    the values pytest-xdist sends back from its workers."""
    from _pytest._code.code import ReprExceptionInfo, ReprFileLocation, ReprTracebackNative

    path, line, _ = item.reportinfo()
    longrepr = ReprExceptionInfo(
        reprtraceback=ReprTracebackNative([text.rstrip("\n") + "\n"]),
        reprcrash=ReprFileLocation(str(path), (line or 0) + 1, reason))
    if section:
        longrepr.addsection("nccl-doctor", section)
    return longrepr


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo):
    outcome = yield
    report = outcome.get_result()
    if report.when != "call":
        return
    failure = call.excinfo.value if call.excinfo is not None else None
    if isinstance(failure, DistributedFailure):
        report.longrepr = failure_repr(item, failure.text, failure.reason, failure.section)
    launches = item.stash.get(_LAUNCHES, None)
    runs = launches.diagnosed() if launches is not None else []
    hangs = [r for r in runs if r.get("verdict") == "hang"]
    # a crash is the test's to judge (it may expect one): told about only when the test fails
    runs = runs if hangs or report.failed else []
    if runs:
        from nccl_doctor.testing.launches import describe, reason

        for n, r in enumerate(runs):
            r["_capture"] = str(keep(item, Path(r["_capture"]), n if len(runs) > 1 else None))
        # the diagnosis once, in full; the captures named once
        text = "\n\n".join(describe(r) for r in runs)
        section = "\n".join(f"{r.get('verdict')}: {r.get('_capture')} (nccl-doctor replay it)"
                             for r in runs)
        if hangs:  # the doctor stopped the job: its diagnosis is the failure
            report.outcome = "failed"
            report.longrepr = failure_repr(item, text, reason(hangs[0]), section)
        else:
            report.longrepr = with_crash(item, report.longrepr, text, reason(runs[0]), section)
    if report.failed and item.stash.get(_DIAGNOSED, False) or runs:
        # a failed test, counted and listed as pytest's own; this property (kept by xdist,
        # written to JUnit XML from the test's later reports) says the doctor diagnosed it
        report.user_properties.append((PROPERTY, "diagnosed"))
        item.user_properties.append((PROPERTY, "diagnosed"))


_DIAGNOSED = pytest.StashKey()


def with_crash(item: pytest.Item, longrepr, text: str, reason: str, section: str):
    """The test's own failure (its traceback, its assertion) followed by the diagnosis of the
    job it launched that crashed: ``reason`` becomes the failure's one line (the short
    summary's, the JUnit ``message``), ``section`` its ``nccl-doctor`` section."""
    from _pytest._code.code import ExceptionRepr, ReprEntryNative

    if not isinstance(longrepr, ExceptionRepr):
        return failure_repr(item, f"{longrepr}\n\n{text}", reason, section)
    longrepr.reprtraceback.reprentries.append(ReprEntryNative([text.rstrip("\n") + "\n"]))
    if longrepr.reprcrash is not None:
        longrepr.reprcrash.message = reason
    longrepr.addsection("nccl-doctor", section)
    return longrepr


def keep(item: pytest.Item, capture: Path, n: int | None = None) -> Path:
    """Copy a failed test's capture where it outlives pytest's temporary directories; the
    path the report names (the temporary one if the copy cannot be made). ``n``: which of the
    test's captures this is, when it kept several (the jobs it launched)."""
    import re
    import shutil

    config = item.config
    chosen = config.getoption("--nccl-doctor-keep") or config.getini("nccl_doctor_keep")
    if chosen:
        base = Path(chosen)
        if not base.is_absolute():
            base = Path(config.rootpath) / base
    elif getattr(config, "cache", None) is not None:
        base = Path(config.cache.mkdir("nccl-doctor"))
    else:
        return capture
    dest = base / re.sub(r"[^A-Za-z0-9_.-]+", "_", item.nodeid).strip("_")[:150]
    if n is not None:
        dest = dest.with_name(f"{dest.name}.{n}")
    try:
        if dest.exists():
            shutil.rmtree(dest)  # the last failure of this test
        shutil.copytree(capture, dest)
    except OSError:
        return capture
    return dest


def pytest_configure(config: pytest.Config) -> None:
    _which_code(config)
    workerinput = getattr(config, "workerinput", None)
    if workerinput is not None and _WIDTH_INPUT in workerinput:
        config.stash[_WIDTH] = workerinput[_WIDTH_INPUT]
    else:  # pytest's own stdout, not captured yet: its terminal's width, or None on a pipe
        import sys

        from nccl_doctor.reporters import layout

        config.stash[_WIDTH] = layout.width_of(sys.stdout)
    config.addinivalue_line(
        "markers",
        f"{MARKER}(world_size=2, timeout=120, backend='gloo'): run the test in world_size "
        "torch.distributed processes under nccl-doctor; a hang or desync fails it with the "
        "diagnosis",
    )


_WIDTH = pytest.StashKey()


@pytest.hookimpl(optionalhook=True)
def pytest_configure_node(node) -> None:
    """pytest-xdist: a worker lays failures out for the controller's terminal, not for its own
    pipe and the ``COLUMNS=80`` it inherits (readline's, in the controller)."""
    node.workerinput[_WIDTH_INPUT] = node.config.stash.get(_WIDTH, None)


def failure_width(config: pytest.Config) -> int:
    """The columns a failure text is laid out for: the terminal's, else unwrapped."""
    width = config.stash.get(_WIDTH, None)
    return NO_WRAP if width is None else width


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(session: pytest.Session, config: pytest.Config,
                                  items: list[pytest.Item]) -> None:
    """A session with distributed tests starts its fork server now: it imports torch while
    the other tests run."""
    if any(item.get_closest_marker(MARKER) for item in items):
        from nccl_doctor.testing import zygote

        zygote.start()


def pytest_unconfigure(config: pytest.Config) -> None:
    import sys

    zygote = sys.modules.get("nccl_doctor.testing.zygote")
    if zygote is not None:
        zygote.shutdown()


def _options(marker: pytest.Mark) -> dict:
    options = dict(DEFAULTS)
    if marker.args:
        options["world_size"] = marker.args[0]
    unknown = set(marker.kwargs) - set(DEFAULTS)
    if unknown:
        raise pytest.UsageError(f"@pytest.mark.{MARKER}: unknown option(s) "
                                f"{', '.join(sorted(unknown))}; use {', '.join(DEFAULTS)}")
    options.update(marker.kwargs)
    if not isinstance(options["world_size"], int) or options["world_size"] < 1:
        raise pytest.UsageError(f"@pytest.mark.{MARKER}: world_size must be a positive int")
    return options


@pytest.fixture
def collectives():
    """Inside a ``@pytest.mark.distributed`` test: what the recorder captured so far -
    ``ops()``, ``counts()``, ``by_rank()``, ``assert_no_desync()``."""
    from nccl_doctor.testing.collectives import Collectives

    return Collectives()


@pytest.hookimpl(tryfirst=True)
def pytest_pyfunc_call(pyfuncitem: pytest.Function) -> bool | None:
    marker = pyfuncitem.get_closest_marker(MARKER)
    if marker is None:
        return None
    from nccl_doctor.testing.runner import PayloadError, run_distributed

    options = _options(marker)
    argnames = pyfuncitem._fixtureinfo.argnames
    kwargs = {name: pyfuncitem.funcargs[name] for name in argnames}
    out = Path(pyfuncitem.config._tmp_path_factory.mktemp("nccl-doctor", numbered=True))
    qualname = pyfuncitem.function.__qualname__
    try:
        outcome = run_distributed(
            module=pyfuncitem.module.__name__, qualname=qualname, kwargs=kwargs,
            world_size=options["world_size"], timeout=float(options["timeout"]),
            backend=options["backend"], out=out)
    except PayloadError as err:
        pytest.fail(str(err), pytrace=False)
    if not outcome.passed:
        if outcome.diagnosis is not None and outcome.diagnosis.findings or outcome.timed_out:
            pyfuncitem.stash[_DIAGNOSED] = True
        if outcome.capture is not None:
            outcome.capture = keep(pyfuncitem, outcome.capture)
        raise DistributedFailure(outcome.failure_text(failure_width(pyfuncitem.config)),
                                 outcome.reason(), outcome.section())
    return True


def _which_code(config: pytest.Config) -> None:
    """The --nccl-doctor-user-code/--nccl-doctor-library-code patterns (or their ini twins),
    for the ranks of every distributed test (through the environment they inherit) and for
    this process's analysis."""
    import os

    from nccl_doctor import paths

    user = config.getoption("--nccl-doctor-user-code") or config.getini("nccl_doctor_user_code")
    library = (config.getoption("--nccl-doctor-library-code")
               or config.getini("nccl_doctor_library_code"))
    if not user and not library:
        return
    for pattern in [*user, *library]:
        if not pattern.strip() or os.pathsep in pattern:
            raise pytest.UsageError(f"nccl-doctor: {pattern!r} is not a code pattern: give one "
                                    "path pattern per option or ini line")
    os.environ.update(paths.with_patterns(os.environ, user, library))
    paths.configure_from(os.environ)
