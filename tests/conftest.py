"""The suite's shared set-up: the ``gpu`` tier (tests marked ``gpu`` run the reproducers and
trainers on CUDA with NCCL; they need an NVIDIA GPU that torch sees, elsewhere each is skipped
with the reason, and the session's header and last lines say whether the tier ran), and how
``make test`` spreads the tests over its pytest-xdist workers (``SHARED``)."""

from __future__ import annotations

from pathlib import Path

import pytest

from nccl_doctor.capture import format as fmt
from nccl_doctor.capture.manifest import Manifest
from nccl_doctor.capture.writer import CaptureWriter
from nccl_doctor.model import EventKind, EventState
from nccl_doctor.trainers.placement import visible_gpus

_GPUS = visible_gpus()

#: Test files whose tests read one real job made once (a module fixture's, a session fixture's:
#: tests/integration/conftest.py ``stopped_hang``, tests/e2e/conftest.py ``clean_capture``) ->
#: the group that keeps them on one worker, so that the job runs once. Every other test is
#: handed to whichever worker is free. (pytest-xdist's own ``xdist_group`` marks are ignored
#: under pytest 9.2: pytest-xdist issue #1386.)
SHARED = {
    "tests/integration/test_watchdog.py": "stopped_hangs",
    "tests/integration/test_replay_live.py": "stopped_hangs",
    "tests/integration/test_data_api.py": "stopped_hangs",
    "tests/integration/test_nodes.py": "nodes",
    "tests/e2e/test_cli.py": "clean_capture",
    "tests/reliability/test_escaping.py": "escaping",
    "tests/reliability/test_damaged_manifest.py": "damaged_manifest",
    "tests/upstream/test_trl.py": "trl",
    "tests/upstream/test_ray.py": "ray",  # one Ray cluster at a time
    "tests/upstream/test_ray_cluster.py": "ray",
    "tests/upstream/test_slurm_cluster.py": "slurm",  # one Slurm cluster at a time
    "tests/upstream/test_slurm.py": "slurm",
}


def shared_scope(nodeid: str) -> str:
    """The unit of work a test goes to a worker in: its file's group, or itself."""
    return SHARED.get(nodeid.split("::", 1)[0], nodeid)


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


def _tier() -> str:
    gpus, why = _GPUS
    return (f"gpu tier: runs on {gpus} GPU{'s' if gpus > 1 else ''}" if gpus
            else f"gpu tier: skipped - {why}")


def pytest_report_header(config) -> str:
    return _tier()


def pytest_terminal_summary(terminalreporter) -> None:  # shown under -q too
    terminalreporter.write_line(_tier())


def pytest_collection_modifyitems(config, items) -> None:
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
