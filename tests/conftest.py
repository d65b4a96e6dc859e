"""The suite's shared set-up: its tiers (``TIERS``: ``make test`` runs the default tier,
``make test-all`` every tier; the others are deselected, never skipped), the ``gpu`` tier (tests
marked ``gpu`` run the reproducers and trainers on CUDA with NCCL; they need an NVIDIA GPU that
torch sees, elsewhere each is skipped with the reason, and the session's header and last lines
say whether the tier ran), and how ``make test`` spreads the tests over its pytest-xdist workers
(``SHARED``)."""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

from nccl_doctor.capture import format as fmt
from nccl_doctor.capture.manifest import Manifest
from nccl_doctor.capture.writer import CaptureWriter
from nccl_doctor.model import EventKind, EventState
from nccl_doctor.trainers.placement import visible_gpus

_GPUS = visible_gpus()

# GNU readline, which pytest imports at its start (_pytest/capture.py), exports COLUMNS=80 and
# LINES=24 into the environment every child process inherits (its rl_change_environment), though
# os.environ does not show them: the CLI the tests run would lay its console report out for 80
# columns. The children get the environment pytest was given (xdist's workers too: they start
# after this).
for _name in ("COLUMNS", "LINES"):
    if _name not in os.environ:
        os.unsetenv(_name)

#: Test files whose tests read one real job made once (a module fixture's, a session fixture's:
#: tests/integration/conftest.py ``stopped_hang``, tests/e2e/conftest.py ``clean_capture``) ->
#: the group that keeps them on one worker, so that the job runs once. Every other test is
#: handed to whichever worker is free. (pytest-xdist's own ``xdist_group`` marks are ignored
#: under pytest 9.2: pytest-xdist issue #1386.)
SHARED = {
    "tests/integration/test_watchdog.py": "stopped_hangs",
    "tests/integration/test_replay_live.py": "stopped_hangs",
    "tests/integration/test_data_api.py": "stopped_hangs",
    "tests/integration/test_notebook_display.py": "stopped_hangs",
    "tests/integration/test_nodes.py": "nodes",
    "tests/e2e/test_cli.py": "clean_capture",
    "tests/e2e/test_console_width.py": "console_width",
    "tests/e2e/test_cli_conventions.py": "clean_capture",
    "tests/reliability/test_escaping.py": "escaping",
    "tests/reliability/test_damaged_manifest.py": "damaged_manifest",
    "tests/upstream/test_trl.py": "trl",
    "tests/upstream/test_ray.py": "ray",  # one Ray cluster at a time
    "tests/upstream/test_ray_cluster.py": "ray",
    "tests/upstream/test_slurm_cluster.py": "slurm",  # one Slurm cluster at a time
    "tests/upstream/test_slurm.py": "slurm",
}


#: Groups whose files' tests share one session fixture, not a module's: only the tests that ask
#: for it (by its name among their arguments) go with the group; the file's others go to
#: whichever worker is free, as any other test does (a 25 s straggler test of test_watchdog.py
#: needs no stopped hang, and held the group's worker 100 s longer).
SHARED_FIXTURES = {"stopped_hangs": "stopped_hang"}


def shared_scope(nodeid: str) -> str:
    """The unit of work a test goes to a worker in: its file's group, or itself."""
    path, _, name = nodeid.partition("::")
    group = SHARED.get(path)
    if group is None:
        return nodeid
    fixture = SHARED_FIXTURES.get(group)
    if fixture is not None and fixture not in _arguments(path).get(name.split("[")[0], {fixture}):
        return nodeid
    return group


_ARGUMENTS: dict[str, dict[str, set[str]]] = {}


def _arguments(path: str) -> dict[str, set[str]]:
    """Each test function of the file at ``path`` (relative to the repository) -> its
    arguments, read from its source once (the scheduler sees node ids, not fixtures)."""
    if path not in _ARGUMENTS:
        import ast

        tree = ast.parse((Path(__file__).parent.parent / path).read_text())
        _ARGUMENTS[path] = {node.name: {a.arg for a in node.args.args}
                            for node in tree.body if isinstance(node, ast.FunctionDef)}
    return _ARGUMENTS[path]


@pytest.hookimpl(optionalhook=True)  # pytest-xdist's hook: -p no:xdist runs without it
def pytest_xdist_make_scheduler(config, log):
    """``--dist loadgroup`` (make test): whole groups of ``SHARED`` to one worker each, every
    other test on its own."""
    if config.getvalue("dist") != "loadgroup":
        return None
    from xdist.scheduler import LoadScopeScheduling

    class SharedJobs(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return shared_scope(nodeid)

    return SharedJobs(config, log)


#: The tiers beyond the default one -> the test files (or directories) that make them. Each test
#: of a tier gets its marker (``-m ray`` selects it). ``pytest`` and ``make test`` run the
#: default tier: everything else (unit tests, the core real gloo jobs, replay, the CLI, the docs,
#: the pytest plugin, the faults of tests/reliability). ``--tier all`` (``make test-all``, CI)
#: runs every tier; ``--tier ray,slurm`` the tiers named (``default`` names the default one).
#: A tier's files named on the command line, or ``-m``, run whatever the tier.
TIERS: dict[str, tuple[str, ...]] = {
    "upstream": ("tests/upstream/test_trl.py",),  # TRL's buggy releases, their own venvs
    "ray": ("tests/upstream/test_ray.py", "tests/upstream/test_ray_cluster.py"),
    "slurm": ("tests/upstream/test_slurm.py", "tests/upstream/test_slurm_cluster.py"),
    "frameworks": ("tests/frameworks/",  # Lightning, Accelerate, Trainer, DeepSpeed
                   "tests/e2e/test_check_corpora.py"),  # check on their installed sources
    "serve": ("tests/e2e/test_serve.py",),  # run --serve: Prometheus and Chromium
    "demos": ("tests/e2e/test_demo.py",),  # every reproducer through nccl-doctor demo
    # 2-D and 3-D meshes (FSDP2 + TP, pp x dp x tp on 8 ranks) and waits through their groups
    "meshes": ("tests/integration/test_mesh_jobs.py", "tests/integration/test_wait_chain_jobs.py"),
    # jobs whose step Inductor compiles (8-11 s a job on 2 cores)
    "compile": ("tests/integration/test_compiled_jobs.py",),
    # the pytest plugin driving whole pytest sessions (pytester) that launch real jobs
    "plugin": ("tests/e2e/test_pytest_plugin.py", "tests/reliability/test_pytest_plugin_faults.py"),
    "nodes": ("tests/integration/test_nodes.py", "tests/integration/test_slow_node.py",
              "tests/integration/test_federation_link.py",  # several node doctors at once
              "tests/integration/test_federation_trust.py"),
    "soak": ("tests/reliability/test_soak.py",),
    "fuzz": ("tests/reliability/test_fuzz.py",),
}
DEFAULT = "default"
#: The frameworks tier's older switch (still honoured): "1" runs it with the default tier.
FRAMEWORKS_ENV = "NCCL_DOCTOR_FRAMEWORKS"


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--tier", default=DEFAULT, metavar="TIERS",
                     help=f"the test tiers to run: 'all', or names separated by commas "
                          f"({DEFAULT}, {', '.join(TIERS)}); default: {DEFAULT} "
                          "(tests/conftest.py TIERS)")


def tier_of(nodeid: str) -> str:
    path = nodeid.split("::", 1)[0]
    return next((tier for tier, files in TIERS.items()
                 if any(path == f or f.endswith("/") and path.startswith(f) for f in files)),
                DEFAULT)


def _chosen(config: pytest.Config) -> set[str] | None:
    """The tiers this session runs (None: all of them)."""
    value = config.getoption("--tier")
    if value == "all" or config.getoption("markexpr", ""):
        return None
    chosen = {t.strip() for t in value.split(",") if t.strip()}
    unknown = chosen - set(TIERS) - {DEFAULT}
    if unknown:
        raise pytest.UsageError(f"--tier {value}: no tier {', '.join(sorted(unknown))}; the "
                                f"tiers: all, {DEFAULT}, {', '.join(TIERS)}")
    if os.environ.get(FRAMEWORKS_ENV) == "1":
        chosen.add("frameworks")
    return chosen


def _named(config: pytest.Config, nodeid: str) -> bool:
    """Whether the command line names this test's tier files (or a part of them) itself."""
    root = Path(config.rootpath)
    path = nodeid.split("::", 1)[0]
    tier_files = TIERS.get(tier_of(nodeid), ())
    for arg in config.args:
        try:
            named = Path(arg.split("::", 1)[0]).resolve().relative_to(root).as_posix()
        except ValueError:
            continue
        if named in ("", ".", "tests"):
            continue
        if path.startswith(named) or any(f.startswith(named.rstrip("/") + "/") or f == named
                                         for f in tier_files):
            return True
    return False


def _tier() -> str:
    gpus, why = _GPUS
    return (f"gpu tier: runs on {gpus} GPU{'s' if gpus > 1 else ''}" if gpus
            else f"gpu tier: skipped - {why}")


def pytest_report_header(config) -> list[str]:
    chosen = _chosen(config)
    if chosen is None:
        tiers = "tiers: all"
    else:
        left = [t for t in TIERS if t not in chosen]
        tiers = (f"tiers: {', '.join(sorted(chosen))}"
                 + (f" (not run: {', '.join(left)}; make test-all or --tier all runs them)"
                    if left else ""))
    return [tiers, _tier()]


def pytest_terminal_summary(terminalreporter) -> None:  # shown under -q too
    terminalreporter.write_line(_tier())


def pytest_collection_modifyitems(config, items) -> None:
    chosen = _chosen(config)
    kept, deselected = [], []
    for item in items:
        tier = tier_of(item.nodeid)
        if tier != DEFAULT:
            item.add_marker(getattr(pytest.mark, tier))
        if chosen is None or tier in chosen or _named(config, item.nodeid):
            kept.append(item)
        else:
            deselected.append(item)
    if deselected:  # (deselected, as -m does: counted in the summary, never a skip)
        config.hook.pytest_deselected(items=deselected)
    # the unit tests first (seconds for hundreds): the run's progress moves from the start
    kept.sort(key=lambda item: not item.nodeid.startswith("tests/unit/"))
    items[:] = kept
    if not config.option.collectonly and any(item.nodeid.startswith("tests/integration/")
                                             for item in kept):
        from nccl_doctor.testing import zygote

        zygote.start()  # the jobs' fork server imports torch while the unit tests run
    gpus, why = _GPUS
    if gpus:
        return
    skip = pytest.mark.skip(reason=f"gpu tier: {why}")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


T0 = 1_700_000_000_000_000_000


@pytest.fixture
def write_desync():
    """``write_desync(root, world, culprit=, calls=, site=)``: a synthetic capture directory
    (the recorder's own writer) of a job that hung in a desync."""
    return _write_desync


def _write_desync(root: Path, world: int, *, culprit: int, calls: int = 12,
                 site: str = "/job/train.py") -> Path:
    """``world`` ranks all_reduce ``calls`` times on the world group; ``culprit`` calls
    all_gather instead at the last one, and every rank is left inside that last call."""
    out = root / f"desync{world}"
    out.mkdir()
    for rank in range(world):
        w = CaptureWriter(out / f"rank{rank:05d}.node{rank // 8}.{100 + rank}{fmt.CAPTURE_SUFFIX}",
                          {"rank": rank, "world_size": world, "host": f"node{rank // 8}",
                           "pid": 100 + rank, "started_ns": T0}, capacity=64,
                          strtab_bytes=4096)
        w.note("group", name="0", ranks=list(range(world)), backend="gloo")
        s = w.intern(site)
        for i in range(1, calls + 1):
            op = "all_gather" if (rank == culprit and i == calls) else "all_reduce"
            idx = w.begin((0, T0 + i * 1_000_000 + rank, i, 256, 1, w.intern(op), w.intern("0"),
                           w.intern("float32[64]"), 0, s, 40 + i % 3, w.intern("step"), s,
                           40 + i % 3, 0, -1, world, 0, int(EventKind.COLLECTIVE), 0, 0))
            if i < calls:
                w.end(idx, int(EventState.RETURNED), 1)
    Manifest(command=("python", "train.py", "--hf-token", "***"), started_at=0.0, run_id="h",
             world_size=world, ended_at=1.0, exit_status=124).write(out)
    return out


class ConsoleChecks:
    """What a console report must keep at any width (tests/unit and tests/e2e
    test_console_width.py): every ``path:line`` whole, headlines broken between phrases."""

    SITE = re.compile(r"[\w./<>-]*\.py:\d+")

    def sites(self, text: str) -> list[str]:
        """Every ``path:line`` of ``text``, line by line (one cut across lines shows as two)."""
        return sorted(m.group() for line in text.splitlines() for m in self.SITE.finditer(line))

    @staticmethod
    def headline(lines: list[str], prefix: str) -> list[str]:
        """The headline starting with ``prefix`` as it was printed: its first line and each
        line that continues it (indented two spaces exactly)."""
        i = next(i for i, line in enumerate(lines) if line.startswith(prefix))
        out = [lines[i]]
        for line in lines[i + 1:]:
            if not (line.startswith("  ") and line[2:3] != " "):
                break
            out.append(line[2:])
        return out

    @staticmethod
    def between_phrases(before: str, after: str) -> bool:
        """A line of a headline ends where a phrase does."""
        return (before.endswith((":", ";", ","))
                or after.startswith(("(", "[", "- ", "-> ", "<- "))
                or after.split(" ", 1)[0] in ("at", "after", "while", "in", "for", "which"))


@pytest.fixture
def fit() -> ConsoleChecks:
    return ConsoleChecks()
