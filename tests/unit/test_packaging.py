"""The package builds without a word from setuptools: no deprecated setting (``project.license``
as a table, deprecated since setuptools 77), no directory of data left out of the packages
(which setuptools warns it will stop installing). ``make install`` fails on the same warnings
from a fresh clone's real install (Makefile); this is its quick twin: the configuration read and
every package laid out, as a wheel's build does, without compiling the C extensions."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
# a Python warning as printed ("path:line: SetuptoolsDeprecationWarning: ..."), whatever its class
WARNING = re.compile(r"\w*Warning: ")


def warnings_of(root: Path, out: Path) -> list[str]:
    """The warnings printed by building the project at ``root`` (its metadata, then its packages
    laid out under ``out``): the lines that say one."""
    out.mkdir(exist_ok=True)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    run = subprocess.run(
        [sys.executable, "-W", "always", "setup.py", "egg_info", "--egg-base", str(out),
         "build_py", "--build-lib", str(out / "lib")],
        cwd=root, env=env, capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-4000:]
    return [line for line in (run.stdout + run.stderr).splitlines() if WARNING.search(line)]


def test_the_build_says_no_warning_and_ships_its_data(tmp_path):
    assert warnings_of(ROOT, tmp_path) == []
    lib = tmp_path / "lib" / "nccl_doctor"
    for data in ("reporters/templates/report.html.j2", "reporters/templates/report.css",
                 "serve/templates/live.html.j2", "rank/_bootstrap/sitecustomize.py",
                 "rank/recorder/_functional_kernel.cpp", "plugins/collective_calls.json",
                 "py.typed"):
        assert (lib / data).is_file(), data
    metadata = (tmp_path / "nccl_doctor.egg-info" / "PKG-INFO").read_text()
    assert "License-Expression: Apache-2.0" in metadata


def test_the_old_settings_would_be_caught(tmp_path):
    """The check sees what the build said before: the licence as a table, the templates'
    directories left out of the packages."""
    old = tmp_path / "old"
    old.mkdir()
    for name in ("setup.py", "README.md", "nccl_doctor", "plugins", "reproducers"):
        if (ROOT / name).is_dir():
            shutil.copytree(ROOT / name, old / name,
                            ignore=shutil.ignore_patterns("__pycache__", "*.so"))
        else:
            shutil.copy(ROOT / name, old / name)
    text = (ROOT / "pyproject.toml").read_text()
    text = text.replace('license = "Apache-2.0"', 'license = { text = "Apache-2.0" }')
    text = text.replace('"nccl_doctor.serve.templates",', "")
    text = text.replace('nccl_doctor = ["', 'nccl_doctor = ["serve/templates/*", "')
    (old / "pyproject.toml").write_text(text)
    said = "\n".join(warnings_of(old, tmp_path / "out"))
    assert "project.license" in said and "nccl_doctor.serve.templates" in said, said
