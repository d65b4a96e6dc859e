"""Start the recorder in a job's Python process, with no change to the user's code.

``nccl-doctor run`` puts ``nccl_doctor/rank/_bootstrap`` on PYTHONPATH; its ``sitecustomize`` calls
``activate()`` in every Python process of the job (torchrun's workers, accelerate, deepspeed,
``python -m``, multiprocessing spawn children). ``activate`` only installs an import hook: torch is
patched when the process itself imports ``torch.distributed``, so a helper process that never
touches torch pays nothing. Stdlib imports only, at module level.
"""

from __future__ import annotations

import importlib.abc
import os
import sys
from pathlib import Path
from typing import Any, Callable

from nccl_doctor import env

_TARGET = "torch.distributed"
_recorder: Any = None


#: torch's own launchers, as the interpreter was started: ``torchrun`` (its console script) or
#: ``python -m torch.distributed.run|launch``. Their process starts ranks and is none: it makes
#: no collective, and arming the recorder there cost its start (and the ranks' after it) about
#: 0.13 s of CPU.
_LAUNCHER_SCRIPTS = ("torchrun",)
_LAUNCHER_MODULES = ("torch.distributed.run", "torch.distributed.launch")


def activate() -> bool:
    """Arm the recorder if NCCL_DOCTOR_DIR is set (and NCCL_DOCTOR_ENABLE is not "0"), in
    every process of the job but torch's own launcher."""
    this_hosts_directory()
    directory = os.environ.get(env.CAPTURE_DIR)
    if not directory or os.environ.get(env.ENABLE, "1") == "0" or is_launcher():
        return False
    install(Path(directory), lazy=True)
    return True


def is_launcher(argv: list[str] | None = None) -> bool:
    """Whether this interpreter was started as torch's launcher (``sys.orig_argv``)."""
    argv = list(getattr(sys, "orig_argv", ()) if argv is None else argv)
    for i, word in enumerate(argv[1:], 1):
        if word == "-m":
            return i + 1 < len(argv) and argv[i + 1] in _LAUNCHER_MODULES
        if word == "-c" or not word.startswith("-"):  # the program: a script (or -c)
            return word != "-c" and os.path.basename(word) in _LAUNCHER_SCRIPTS
    return False


def this_hosts_directory() -> None:
    """A job whose node doctors the cluster started (``--ray``, Slurm): on a host other than the
    leader's, NCCL_DOCTOR_DIR becomes that host's node directory, where its node doctor reads.
    Done once per process tree there: the leader's host is then forgotten, so a rank's own
    children inherit the directory as it is. On the leader's host nothing changes (a Ray driver
    there hands the leader's host on to every worker through Ray's runtime_env)."""
    leader = os.environ.get(env.LEADER_HOST)
    directory = os.environ.get(env.CAPTURE_DIR)
    if directory and leader and env.host_name() != leader:
        from nccl_doctor.capture.names import node_dir

        os.environ[env.CAPTURE_DIR] = str(node_dir(Path(directory), env.host_name()))
        del os.environ[env.LEADER_HOST]


def install(directory: Path, *, lazy: bool = False) -> Any:
    """Create the recorder for ``directory`` and patch torch.distributed (now, or at its import)."""
    global _recorder
    if _recorder is None:
        from nccl_doctor.capture import format as fmt
        from nccl_doctor.rank import hooks
        from nccl_doctor.rank.recorder.core import Recorder

        _recorder = Recorder(
            directory.absolute(),
            capacity=_env_size(env.RING_RECORDS, fmt.DEFAULT_RING_RECORDS, 16),
            strtab_bytes=_env_size(env.STRTAB_BYTES, fmt.DEFAULT_STRTAB_BYTES, 4096),
        )
        hooks.connect(_recorder.observe)  # the hooks write through the recorder, never import it
        os.register_at_fork(after_in_child=_after_fork)
        from nccl_doctor.rank import early_exit
        early_exit.arm(_recorder)  # a rank that raises before its capture exists is kept too
    module = sys.modules.get(_TARGET)
    if module is not None and hasattr(module, "all_reduce"):
        _patch(module)
    elif lazy:
        sys.meta_path.insert(0, _PostImportFinder(_TARGET, _patch))
    else:
        import torch.distributed

        _patch(torch.distributed)
    return _recorder


def _patch(module: Any) -> None:
    try:
        if getattr(module, "is_available", lambda: False)():
            _recorder.patch(module)
            from nccl_doctor.rank import hooks
            hooks.install(sys.modules["torch"], when_imported, integrations())
    except Exception as err:  # never break the user's import of torch
        _recorder.fail(err)


def integrations() -> list[Any]:
    """The hooks registered for other libraries (entry-point group ``nccl_doctor.integrations``:
    nccl-doctor's own, plugins/integrations.py, and any installed distribution's)."""
    from nccl_doctor import entry_points

    out = []
    for _name, found, err in entry_points.load(entry_points.INTEGRATIONS):
        if err is None and isinstance(found, (list, tuple)):
            out.extend(found)
    return out


def when_imported(name: str, callback: Callable[[Any], None]) -> None:
    """Run ``callback(module)`` right after ``name`` is imported."""
    sys.meta_path.insert(0, _PostImportFinder(name, callback))


def _after_fork() -> None:
    if _recorder is not None:
        _recorder.after_fork_in_child()


def _env_size(name: str, default: int, minimum: int) -> int:
    try:
        return max(minimum, int(os.environ.get(name, default)))
    except ValueError:
        return default


class _PostImportFinder(importlib.abc.MetaPathFinder):
    """Runs ``callback(module)`` right after ``name`` has been imported, then removes itself."""

    def __init__(self, name: str, callback: Callable[[Any], None]) -> None:
        self.name, self.callback, self._busy = name, callback, False

    def find_spec(self, fullname: str, path: Any = None, target: Any = None) -> Any:
        if fullname != self.name or self._busy:
            return None
        self._busy = True
        try:
            spec = None
            for finder in sys.meta_path:
                if finder is self or not hasattr(finder, "find_spec"):
                    continue
                spec = finder.find_spec(fullname, path, target)
                if spec is not None:
                    break
        finally:
            self._busy = False
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        spec.loader = _CallbackLoader(spec.loader, self)
        return spec

    def loaded(self, module: Any) -> None:
        try:
            sys.meta_path.remove(self)
        except ValueError:
            pass
        self.callback(module)


class _CallbackLoader(importlib.abc.Loader):
    def __init__(self, loader: Any, finder: _PostImportFinder) -> None:
        self._loader, self._finder = loader, finder

    def create_module(self, spec: Any) -> Any:
        return self._loader.create_module(spec)

    def exec_module(self, module: Any) -> None:
        self._loader.exec_module(module)
        self._finder.loaded(module)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._loader, name)
