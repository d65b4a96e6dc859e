"""The ``collectives`` fixture's object: what the recorder captured, asked from inside a rank.

It holds no state (it is made in the test process and sent to every rank): each call reads the
captures of the current run, this rank's or all of them, from the capture directory.
"""

from __future__ import annotations

import os
from collections import Counter
from pathlib import Path

from nccl_doctor import env
from nccl_doctor.model import EventKind, TraceSet


class Collectives:
    def _traces(self) -> TraceSet:
        from nccl_doctor.analysis.calls.loaded import load_capture_dir

        directory = os.environ.get(env.CAPTURE_DIR)
        if not directory:
            raise RuntimeError("collectives: not running under nccl-doctor (use it in a "
                               "@pytest.mark.distributed test)")
        return load_capture_dir(Path(directory), job_ended=False)

    def _rank(self) -> int:
        import torch.distributed as dist

        return dist.get_rank()

    def by_rank(self, group: str | None = None) -> dict[int, list[str]]:
        """Each rank's collective ops so far, in order (``group``: one process group's only)."""
        return {r: [e.op for e in t.events if e.kind is EventKind.COLLECTIVE and e.parent == 0
                    and (group is None or e.group == group)]
                for r, t in sorted(self._traces().ranks.items())}

    def ops(self, group: str | None = None) -> list[str]:
        """This rank's collective ops so far, in order."""
        return self.by_rank(group).get(self._rank(), [])

    def counts(self, group: str | None = None) -> Counter:
        """How many times this rank called each collective."""
        return Counter(self.ops(group))

    def assert_no_desync(self) -> None:
        """Fail if the ranks' recorded collectives disagree (a mismatch, a missing collective).
        Call it after a barrier: a rank still on its way looks like a missing collective."""
        from nccl_doctor.analysis import analyze
        from nccl_doctor.diagnosis import FindingKind

        desync = (FindingKind.COLLECTIVE_MISMATCH, FindingKind.MISSING_COLLECTIVE)
        found = [f for f in analyze(self._traces()).findings if f.kind in desync]
        if found:
            raise AssertionError("collectives desynced: " + "; ".join(
                f"{f.kind.value}: {f.title}" for f in found))
