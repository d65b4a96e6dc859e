"""Virtual environments of pinned upstream releases (TRL's buggy ones), built by the test tier
itself and cached between runs: the real library code users ran, in an environment of its own,
while nccl-doctor runs from the repository (its ranks import it through
NCCL_DOCTOR_PACKAGE_PARENT, as any rank whose interpreter lacks the package does).

Each is layered on the environment running the tests: a ``.pth`` file puts that environment's
site-packages after its own, so torch and the rest are shared and pip installs only the pins and
what they need at other versions (which then come first). That makes a build tens of seconds,
not minutes of copying torch.

A build may need more than pins: packages installed first (DeepSpeed is an sdist whose
``setup.py`` needs ``wheel``), pip arguments (``--no-build-isolation``, so that its build uses the
shared CPU torch instead of pulling a CUDA one) and environment variables (``DS_BUILD_OPS=0``,
``DS_ACCELERATOR=cpu``): ``python_for``'s ``first``, ``pip_args`` and ``env`` (``FRAMEWORKS``).

Cached under ``$NCCL_DOCTOR_UPSTREAM_CACHE`` (default ``~/.cache/nccl-doctor/upstream``), one
directory per name and hash of (Python version, pins, the build's extras, the repository's
constraints, the base environment and what it holds): a changed pin or base builds a new one. A
build holds a file lock (pytest-xdist workers never build one twice) and marks the environment
ready last; a failed build leaves nothing behind.
"""

from __future__ import annotations

import fcntl
import hashlib
import importlib.metadata
import os
import shutil
import subprocess
import sys
import sysconfig
import time
from pathlib import Path
from typing import Any, Mapping, Sequence

ROOT = Path(__file__).resolve().parents[2]
CONSTRAINTS = ROOT / "constraints.txt"
READY = ".nccl-doctor-ready"

#: docs/bugs.md A (TRL #3068): CPO gathers per-rank-padded logits; fixed in 0.17.0.
TRL_0_16_1 = ("trl==0.16.1", "transformers==4.51.3", "accelerate==1.6.0", "datasets==3.5.0")
#: docs/bugs.md B (TRL #2879): SFT token accuracy gathers padded logits; fixed in 0.15.1.
TRL_0_15_0 = ("trl==0.15.0", "transformers==4.48.3", "accelerate==1.3.0", "datasets==3.2.0")
#: tests/frameworks: the current releases of the frameworks users train with.
FRAMEWORKS = ("lightning==2.6.6", "accelerate==1.15.0", "transformers==5.24.0", "deepspeed==0.19.8")
#: DeepSpeed's sdist: built with ``wheel``, against the environment's torch, with no ops compiled.
FRAMEWORKS_BUILD: dict[str, Any] = {
    "first": ("wheel",), "pip_args": ("--no-build-isolation",),
    "env": {"DS_BUILD_OPS": "0", "DS_ACCELERATOR": "cpu"}}


def cache_dir() -> Path:
    return Path(os.environ.get("NCCL_DOCTOR_UPSTREAM_CACHE")
                or Path.home() / ".cache" / "nccl-doctor" / "upstream")


def python_for(name: str, pins: Sequence[str], *, first: Sequence[str] = (),
               pip_args: Sequence[str] = (), env: Mapping[str, str] | None = None) -> Path:
    """The python of the environment ``name`` with ``pins`` installed (torch pinned by the
    repository's constraints), built now if it is not cached. ``first``: packages installed
    before the pins (what an sdist's build needs); ``pip_args``: more arguments to the pins'
    ``pip install``; ``env``: variables set for both installs."""
    base = sysconfig.get_paths()["purelib"]
    extras = [f"first={','.join(first)}", f"pip_args={' '.join(pip_args)}",
              *(f"env:{k}={v}" for k, v in sorted((env or {}).items()))]
    key = hashlib.sha256("\n".join(  # (no extras: the same key as before they existed)
        [sys.version.split()[0], *sorted(pins), CONSTRAINTS.read_text(), base,
         *_installed(), *(extras if first or pip_args or env else [])]).encode()).hexdigest()[:12]
    venv = cache_dir() / f"{name}-{key}"
    python = venv / "bin" / "python"
    if (venv / READY).is_file():
        return python
    venv.parent.mkdir(parents=True, exist_ok=True)
    with open(venv.parent / f"{venv.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if (venv / READY).is_file():  # another worker built it meanwhile
            return python
        shutil.rmtree(venv, ignore_errors=True)  # a build cut off before it was ready
        started = time.monotonic()
        try:
            _run([sys.executable, "-m", "venv", str(venv)])
            site = Path(subprocess.run(
                [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                capture_output=True, text=True, check=True).stdout.strip())
            (site / "_nccl_doctor_base.pth").write_text(base + "\n")  # after its own packages
            pip = [str(python), "-m", "pip", "install", "--quiet", "--disable-pip-version-check",
                   "-c", str(CONSTRAINTS)]
            build_env = {**os.environ, **(env or {})}
            if first:
                _run([*pip, *first], build_env)
            _run([*pip, *pip_args, *pins], build_env)
        except BaseException:
            shutil.rmtree(venv, ignore_errors=True)
            raise
        (venv / READY).write_text(f"built in {time.monotonic() - started:.0f} s\n")
    return python


def _installed() -> list[str]:
    """What the base environment holds (name==version), which the layered ones see."""
    return sorted(f"{d.metadata['Name']}=={d.version}" for d in importlib.metadata.distributions())


def _run(cmd: list[str], env: Mapping[str, str] | None = None) -> None:
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=1800, env=env)
    if proc.returncode != 0:
        tail = "\n".join((proc.stdout + proc.stderr).splitlines()[-15:])
        raise RuntimeError(f"building an upstream environment failed: {' '.join(cmd)}\n{tail}")


if __name__ == "__main__":  # build them ahead: python tests/upstream/envs.py
    for label, pins, build in (("trl-0.16.1", TRL_0_16_1, {}), ("trl-0.15.0", TRL_0_15_0, {}),
                               ("frameworks", FRAMEWORKS, FRAMEWORKS_BUILD)):
        t0 = time.monotonic()
        print(label, python_for(label, pins, **build), f"{time.monotonic() - t0:.0f} s",
              flush=True)
