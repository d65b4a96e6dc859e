"""What the command line imports before it runs a command: only what the command needs.

``nccl-doctor run`` pays for every module its parser imports before the job starts (issue 42:
pandas, through ``export``'s options, cost a run 0.2 s). Each check runs in a fresh interpreter,
since this test process has imported everything already.
"""

from __future__ import annotations

import json
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
                                                                             "f.csv"]])
def test_the_parser_imports_no_command_s_work(argv):
    code = ("from nccl_doctor.cli.main import build_parser\n"
            f"build_parser().parse_args({argv!r})")
    assert _imported(code, NOT_FOR_THE_PARSER) == []


def test_the_probe_sees_an_import():
    assert _imported("import nccl_doctor.data.columns", ("pandas", "numpy")) == ["pandas",
                                                                                  "numpy"]


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
