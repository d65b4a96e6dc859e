"""One rank of a distributed test: ``python -m nccl_doctor.testing.worker PAYLOAD`` under
``nccl_doctor.testing.spawn``. Imports the test's module the way pytest did (its sys.path),
joins the process group, calls the test function with its fixture values, and writes what
happened to ``rank<N>.result.json`` next to the payload. Exit status 0 when the test passed on
this rank.

A test that fails on this rank (an assertion, any exception) ends the rank with that exception,
as a script would (through ``sys.excepthook``, exit status 1; its traceback in the result, once,
without nccl-doctor's own frames): the recorder keeps it (type, message, the test's
line) and the diagnosis names it - "rank 1 raised AssertionError at test_x.py:12" - with its
peers' errors as its consequences. A barrier first would pair with whatever collective a peer is
in and turn the failure into a desync of the doctor's own making."""

from __future__ import annotations

import contextlib
import importlib
import io
import json
import os
import pickle
import sys
import traceback
import types
from pathlib import Path


def main(argv: list[str]) -> int:
    payload_path = Path(argv[0])
    # our own file, written by the test process for this run (never input from elsewhere)
    payload = pickle.loads(payload_path.read_bytes())
    rank = int(os.environ.get("RANK", "0"))
    result_path = payload_path.parent / f"rank{rank}.result.json"
    sys.path[:] = payload["sys_path"]
    import torch.distributed as dist

    result: dict = {"rank": rank, "passed": False}
    failure: BaseException | None = None
    module = None
    try:
        module = importlib.import_module(payload["module"])
        target = module
        owner, _, name = payload["qualname"].rpartition(".")
        if owner:  # a test class: pytest makes one instance per test
            target = getattr(module, owner)()
        func = getattr(target, name)
        dist.init_process_group(payload["backend"])
        func(**payload["kwargs"])
        result["passed"] = True
    except BaseException as err:  # the test's failure on this rank, whatever it is
        failure = trim(err, getattr(module, "__file__", None))
        result.update(error=f"{type(err).__name__}: {err}"[:2000],
                      traceback="".join(traceback.format_exception(failure))[-20000:])
    finally:
        result_path.write_text(json.dumps(result))
    if isinstance(failure, (KeyboardInterrupt, SystemExit)):
        raise failure  # the interpreter's own end: SIGINT, the status
    if failure is not None:
        # the rank ends as the interpreter ends it for an uncaught exception - sys.excepthook
        # (the recorder keeps it), exit status 1 - but for the frames of this worker a re-raise
        # would put back. Its traceback is the result's, which the test's failure shows: not
        # printed here as well (pytest's "Captured stderr" would show it a second time).
        with contextlib.redirect_stderr(io.StringIO()):
            sys.excepthook(type(failure), failure, failure.__traceback__)
        return 1
    if dist.is_initialized():
        try:
            # no rank tears down while a peer still talks; called on the process group itself,
            # so the recorder (and the collectives fixture) sees only the test's own calls
            dist.distributed_c10d._get_default_group().barrier().wait()
            dist.destroy_process_group()
        except Exception:
            pass
    return 0 if result["passed"] else 1


_PACKAGE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # nccl_doctor/


def trim(err: BaseException, test_file: str | None = None) -> BaseException:
    """``err`` (and the exceptions it was raised from or during) with tracebacks that leave out
    nccl-doctor's own frames - this worker, the recorder's wrappers around torch's calls -
    unless the test itself lives in the package (``test_file``), and the frames that set
    ``__tracebackhide__``, as pytest hides them: the rank's traceback is the test's."""
    keep = os.path.abspath(test_file) if test_file else None

    def shown(tb: types.TracebackType) -> bool:
        frame = tb.tb_frame
        if frame.f_locals.get("__tracebackhide__",
                              frame.f_globals.get("__tracebackhide__", False)):
            return False
        path = os.path.abspath(frame.f_code.co_filename)
        return path == keep or not path.startswith(_PACKAGE + os.sep)

    seen: set[int] = set()
    pending: list[BaseException | None] = [err]
    while pending:
        exc = pending.pop()
        if exc is None or id(exc) in seen:
            continue
        seen.add(id(exc))
        frames, tb = [], exc.__traceback__
        while tb is not None:
            if shown(tb):
                frames.append(tb)
            tb = tb.tb_next
        trimmed = None
        for tb in reversed(frames):
            trimmed = types.TracebackType(trimmed, tb.tb_frame, tb.tb_lasti, tb.tb_lineno)
        exc.__traceback__ = trimmed
        pending += [exc.__cause__, exc.__context__]
    return err


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
