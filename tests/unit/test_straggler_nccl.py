"""Stragglers on NCCL groups (issue 17): an NCCL call returns once enqueued, so a rank arrives at
a collective when its kernel starts on the GPU, not when its CPU queued the call. NCCL-shaped
events, as the H100 runs produced them (tests/fixtures/gpu/h100/README.md): a start-up offset
that enqueue times keep forever, and a rank that sleeps 3 s before each all_reduce while its
peer enqueues all of them at once."""

from __future__ import annotations

from dataclasses import replace

import pytest

from nccl_doctor.analysis import analyze
from nccl_doctor.analysis.slow.straggler import detect_straggler
from nccl_doctor.capture.flight_recorder import merge
from nccl_doctor.diagnosis import FindingKind
from nccl_doctor.model import GroupInfo

MS = 1_000_000
N = 6


def job(tb, enters: dict[int, list[int]], starts: dict[int, list[int]] | None,
        backend: str = "nccl"):
    """Two ranks' all_reduces: CPU enter times and (None: unknown) GPU start times."""
    traces = []
    for r, times in enters.items():
        events = [tb.event(i + 1, t_enter_ns=t) for i, t in enumerate(times)]
        if starts is not None:
            events = [replace(e, t_gpu_start_ns=starts[r][i]) for i, e in enumerate(events)]
        traces.append(tb.trace(r, events, tb.clean()))
    ts = tb.traceset(traces)
    return replace(ts, groups={"0": GroupInfo("0", (0, 1), backend)})


def offset_only(tb, n: int = N) -> dict[int, list[int]]:
    """Rank 1 started 23 ms late and stays 23 ms behind on the CPU; the GPUs meet each time."""
    return {0: [tb.T0 + i * 100 * MS for i in range(n)],
            1: [tb.T0 + i * 100 * MS + 23 * MS for i in range(n)]}


def sleeper(tb) -> tuple[dict[int, list[int]], dict[int, list[int]]]:
    """Rank 1 sleeps 3 s before each all_reduce; rank 0 enqueues all of them at once, and its
    kernel k starts when kernel k-1 completes, i.e. just after rank 1 arrived at k-1."""
    one = [tb.T0 + (i + 1) * 3000 * MS for i in range(N)]
    enters = {0: [tb.T0 + i * MS // 10 for i in range(N)], 1: one}
    starts = {0: [tb.T0] + [t + MS for t in one[:-1]], 1: one}
    return enters, starts


def test_a_start_up_offset_is_not_a_straggler_with_gpu_times(tb):
    enters = offset_only(tb)
    gpu = {r: [tb.T0 + i * 100 * MS + 50 * MS + r * MS // 10 for i in range(N)] for r in enters}
    assert detect_straggler(job(tb, enters, gpu)) == []
    # the same CPU times on gloo, where a call returns when the collective did: 6 of 6 by 23 ms
    # on 2 ranks is what 6 coin flips do 1 time in 64 - not yet a straggler; 12 of 12 is
    assert detect_straggler(job(tb, enters, None, backend="gloo")) == []
    (f,) = detect_straggler(job(tb, offset_only(tb, 12), None, backend="gloo"))
    assert f.ranks == (1,) and f.evidence["chance"]["1"] == pytest.approx(2**-12, rel=1e-2)


def test_a_rank_sleeping_3s_is_a_3s_straggler_on_gpu_times(tb):
    enters, starts = sleeper(tb)
    (f,) = detect_straggler(job(tb, enters, starts))
    assert f.kind is FindingKind.STRAGGLER and f.ranks == (1,)
    assert 2900 <= f.evidence["median_ms"] <= 3100 and f.evidence["p95_ms"] <= 3100
    assert f.evidence["last"] == {"1": N}


def test_without_gpu_times_nccl_skew_is_not_claimed_and_a_note_says_why(tb):
    enters, _ = sleeper(tb)
    ts = job(tb, enters, None)
    assert detect_straggler(ts) == []
    d = analyze(ts)
    assert not any(f.kind is FindingKind.STRAGGLER for f in d.findings)
    (note,) = [n for n in d.notes if n.startswith("stragglers:")]
    assert f"{N} collectives of NCCL group 0 not compared" in note
    assert "TORCH_NCCL_ENABLE_TIMING=1" in note
    # the offset-only run: no false alarm either
    assert detect_straggler(job(tb, offset_only(tb), None)) == []
    # gloo groups are compared on enter times as before, with no note
    assert not any(n.startswith("stragglers:") for n in
                   analyze(job(tb, enters, None, backend="gloo")).notes)


def test_flight_recorder_start_times_reach_the_recorded_calls(tb):
    enters, starts = sleeper(tb)
    ts = job(tb, enters, None)

    def dump(rank: int) -> dict:
        return {"entries": [{
            "record_id": i, "pg_id": 0, "process_group": ["0", "default_pg"],
            "collective_seq_id": i + 1, "p2p_seq_id": 0, "op_id": i + 1,
            "profiling_name": "nccl:all_reduce", "is_p2p": False,
            "input_sizes": [[4]], "input_dtypes": ["Float"], "output_sizes": [[4]],
            "output_dtypes": ["Float"], "state": "completed", "retired": True,
            "time_created_ns": enters[rank][i],
            "time_discovered_started_ns": starts[rank][i] if i < N - 1 else None,
            "time_discovered_completed_ns": starts[rank][i] + MS, "thread_id": 7,
            "thread_name": "pt_main_thread", "timeout_ms": 600000,
        } for i in range(N)]}

    merged = merge(ts, {0: dump(0), 1: dump(1)})
    got = [e.t_gpu_start_ns for e in merged.ranks[1].events]
    assert got == starts[1][:-1] + [None]  # the last entry had no start time
    assert len(merged.ranks[1].events) == N  # nothing added: the recorder saw every call
    (f,) = detect_straggler(merged)  # 5 collectives with GPU times on both ranks
    assert f.ranks == (1,) and f.evidence["considered"] == N - 1
