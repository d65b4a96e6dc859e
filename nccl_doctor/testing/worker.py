"""One rank of a distributed test: ``python -m nccl_doctor.testing.worker PAYLOAD`` under
``nccl_doctor.testing.spawn``. Imports the test's module the way pytest did (its sys.path),
joins the process group, calls the test function with its fixture values, and writes what
happened to ``rank<N>.result.json`` next to the payload. Exit status 0 when the test passed on
this rank.

A test that fails on this rank (an assertion, any exception) ends the rank with that exception,
as a script would: the recorder keeps it (type, message, the test's line) and the diagnosis
names it - "rank 1 raised AssertionError at test_x.py:12" - with its peers' errors as its
consequences. A barrier first would pair with whatever collective a peer is in and turn the
failure into a desync of the doctor's own making."""

from __future__ import annotations

import importlib
import json
import os
import pickle
import sys
import traceback
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
        failure = err
        result.update(error=f"{type(err).__name__}: {err}"[:2000],
                      traceback="".join(traceback.format_exception(err))[-20000:])
    finally:
        result_path.write_text(json.dumps(result))
    if failure is not None:
        raise failure  # the rank ends with it (sys.excepthook: the recorder keeps it)
    if dist.is_initialized():
        try:
            # no rank tears down while a peer still talks; called on the process group itself,
            # so the recorder (and the collectives fixture) sees only the test's own calls
            dist.distributed_c10d._get_default_group().barrier().wait()
            dist.destroy_process_group()
        except Exception:
            pass
    return 0 if result["passed"] else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
