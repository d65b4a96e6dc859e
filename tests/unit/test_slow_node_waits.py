"""A slow node named from the nodes' digests alone: its ranks wait far less per call than the
other hosts' (analysis/slow/waits.py)."""

from __future__ import annotations

from dataclasses import replace


def _job(tb, waits_ms: dict[str, float], calls: int = 60):
    traces = []
    for i, (host, ms) in enumerate(sorted(waits_ms.items())):
        for r in (2 * i, 2 * i + 1):
            t = tb.trace(r, tb.collectives(3, group_size=2 * len(waits_ms)), tb.RUNNING,
                         world_size=2 * len(waits_ms))
            note = {"note": "waits", "groups": {"0": [calls, int(calls * ms * 1e6)]}}
            traces.append(replace(t, meta=replace(t.meta, host=host), notes=(note,)))
    return tb.traceset(traces)


def test_the_host_whose_ranks_wait_least_is_the_slow_node(tb):
    from nccl_doctor.analysis.slow.waits import detect_slow_node_from_waits

    (f,) = detect_slow_node_from_waits(_job(tb, {"a": 50.5, "b": 0.5, "c": 50.0, "d": 51.0}))
    assert f.ranks == (2, 3) and f.evidence.node["host"] == "b"
    assert f.evidence.median_ms == 50.0 and "node b (ranks 2, 3) is slow" in f.title
    # nobody apart: no node named
    assert detect_slow_node_from_waits(_job(tb, {"a": 50, "b": 48, "c": 51, "d": 49})) == []
    # 5 ms less than the others: within arrival noise
    assert detect_slow_node_from_waits(_job(tb, {"a": 10, "b": 5, "c": 10, "d": 10})) == []
    # two hosts waiting little: not one node's doing
    assert detect_slow_node_from_waits(_job(tb, {"a": 50, "b": 0.5, "c": 1, "d": 50})) == []
    # too few calls in the window to say
    assert detect_slow_node_from_waits(
        _job(tb, {"a": 50.5, "b": 0.5, "c": 50.0, "d": 51.0}, calls=4)) == []
