"""pytest plugin (entry point ``pytest11``): distributed tests fail with a diagnosis instead of
hanging CI.

``@pytest.mark.distributed(world_size=2, timeout=120, backend="gloo")`` runs the test function
in ``world_size`` processes with torch.distributed initialised (torchrun, a free port), under the
recorder and the watchdog. A deadlock, a mismatch, a crash of any rank or the timeout fails the
test with the diagnosis as its failure text and an ``nccl-doctor`` report section; an assertion
error on any rank shows that rank's traceback. A passing test passes quietly.
"""

from __future__ import annotations

from pathlib import Path

import pytest

MARKER = "distributed"
DEFAULTS = {"world_size": 2, "timeout": 120.0, "backend": "gloo"}


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        f"{MARKER}(world_size=2, timeout=120, backend='gloo'): run the test in world_size "
        "torch.distributed processes under nccl-doctor; a hang or desync fails it with the "
        "diagnosis",
    )


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
        pyfuncitem.add_report_section("call", "nccl-doctor", outcome.summary())
        pytest.fail(outcome.failure_text(), pytrace=False)
    return True
