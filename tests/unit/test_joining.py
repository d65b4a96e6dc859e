"""The rendezvous before any capture (capture/joining.py, analysis/what/rendezvous.py): the joining
records as a rank writes and the supervisor reads them, damaged ones skipped; ranks told
different rendezvous; ranks that never came."""

from __future__ import annotations

import os
from dataclasses import replace

from nccl_doctor.analysis.what.rendezvous import detect_rendezvous, never_joined, parted
from nccl_doctor.capture.joining import read_joinings, write_joining
from nccl_doctor.diagnosis import FindingKind
from nccl_doctor.model import Joining
from tests.unit.conftest import make_traceset


def joining(rank, address="127.0.0.1:29500", world=4):
    return Joining(rank=rank, world_size=world, local_world_size=world, host="vm",
                   pid=100 + rank, time_ns=1_000 + rank, address=address, backend="gloo")


def test_a_joining_record_is_read_back_and_damaged_ones_are_skipped(tmp_path):
    path = write_joining(tmp_path, 2, 4, "vm", local_world_size=4,
                         address="127.0.0.1:29500", backend="gloo", time_ns=5)
    assert path is not None and path.name == f"rank00002.vm.{os.getpid()}.joining"
    (tmp_path / "rank00003.vm.1.joining").write_text("{not json")
    (tmp_path / "rank00001.vm.1.joining").write_text('{"format": "something else"}')
    (tmp_path / "notarank.joining").write_text("{}")
    os.mkfifo(tmp_path / "rank00000.vm.1.joining")  # never opened: it would block
    found = read_joinings(tmp_path)
    assert list(found) == [2]
    assert found[2] == Joining(2, 4, 4, "vm", os.getpid(), 5, "127.0.0.1:29500", "gloo")


def test_ranks_told_different_rendezvous_are_parted_the_fewer_named():
    found = parted({r: joining(r) for r in (0, 1, 2)}
                   | {3: joining(3, "127.0.0.1:29501")})
    assert found is not None and found.kind is FindingKind.BLOCKED_WAIT
    assert found.ranks == (3,)
    assert found.title.startswith("rank 3 joined another rendezvous than ranks 0-2")
    assert found.evidence.rendezvous[3] == "127.0.0.1:29501 (world size 4)"
    # another world size is another rendezvous too
    sized = parted({0: joining(0), 1: joining(1, world=2)})
    assert sized is not None and "world size 2" in sized.title
    assert parted({r: joining(r) for r in range(4)}) is None


def test_ranks_that_never_came_are_named_offline_only_when_no_rank_got_past_init():
    traces = replace(make_traceset([]), world_size=4,
                     joining={r: joining(r) for r in (0, 1, 2)})
    (found,) = detect_rendezvous(traces)
    assert found.ranks == (3,) and found.title.startswith("rank 3 never joined the rendezvous")
    assert "for" not in found.title.split("init_process_group")[-1]  # no wait time offline
    assert detect_rendezvous(replace(traces, unfinished="still running")) == []
    everyone = replace(traces, joining={r: joining(r) for r in range(4)})
    assert detect_rendezvous(everyone) == []
    live = never_joined({0: joining(0)}, [1, 2, 3], {}, 130.0)
    assert "for 130 s" in live.title and live.ranks == (1, 2, 3)
