"""nccl-doctor's bootstrap: `nccl-doctor run` puts this directory first on PYTHONPATH so that every
Python process of the job loads it. It arms the recorder, then loads the sitecustomize it shadows.
It must never fail the interpreter it runs in."""


def _nccl_doctor_boot() -> None:
    import os
    import sys

    try:
        try:
            from nccl_doctor.rank import bootstrap
        except ImportError:
            parent = os.environ.get("NCCL_DOCTOR_PACKAGE_PARENT")
            if not parent:
                return
            sys.path.append(parent)
            from nccl_doctor.rank import bootstrap
        bootstrap.activate()
    except Exception as err:  # noqa: BLE001 - the job must start regardless
        sys.stderr.write(f"nccl-doctor: recorder not started ({err!r}); the job runs unrecorded\n")


def _nccl_doctor_chain() -> None:
    import importlib.machinery
    import importlib.util
    import os
    import sys

    here = os.path.dirname(os.path.abspath(__file__))
    paths = [p for p in sys.path if os.path.abspath(p or os.curdir) != here]
    try:
        spec = importlib.machinery.PathFinder.find_spec("sitecustomize", paths)
        if spec is None or spec.loader is None or spec.origin is None:
            return
        if os.path.abspath(spec.origin) == os.path.abspath(__file__):
            return
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    except Exception as err:  # noqa: BLE001
        sys.stderr.write(f"nccl-doctor: the job's own sitecustomize failed: {err!r}\n")


_nccl_doctor_boot()
_nccl_doctor_chain()
