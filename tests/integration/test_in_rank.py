"""Recorder checks from inside the ranks, written with our own pytest plugin
(``@pytest.mark.distributed`` and the ``collectives`` fixture)."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist

pytestmark = pytest.mark.integration


@pytest.mark.distributed(world_size=2, timeout=90)
def test_each_rank_records_its_collectives_in_order(collectives):
    t = torch.ones(4)
    dist.all_reduce(t)
    dist.broadcast(t, src=1)
    parts = [torch.empty(4) for _ in range(2)]
    dist.all_gather(parts, t)
    objects = [None, None]
    dist.all_gather_object(objects, {"rank": dist.get_rank()})  # recorded once, its inner calls
    work = dist.all_reduce(t, async_op=True)                     # are nested under it
    work.wait()
    dist.barrier()
    ops = collectives.ops()
    assert ops == ["all_reduce", "broadcast", "all_gather", "all_gather_object", "all_reduce",
                   "barrier"], ops
    assert collectives.counts()["all_reduce"] == 2
    assert objects == [{"rank": 0}, {"rank": 1}]
    collectives.assert_no_desync()


@pytest.mark.distributed(world_size=3, timeout=90)
def test_subgroups_are_recorded_per_group(collectives):
    pair = dist.new_group([0, 1])
    if dist.get_rank() in (0, 1):
        dist.all_reduce(torch.ones(2), group=pair)
    dist.barrier()
    everything = collectives.by_rank()
    assert everything == {0: ["all_reduce", "barrier"], 1: ["all_reduce", "barrier"],
                          2: ["barrier"]}, everything
    default = collectives.by_rank(group="0")  # the default group's name
    assert default == {0: ["barrier"], 1: ["barrier"], 2: ["barrier"]}, default
    collectives.assert_no_desync()
