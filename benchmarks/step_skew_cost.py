"""What reading calls paired across steps costs (analysis/silent/step_skew.py): the pass on a job
of RANKS ranks on a 2-D mesh (a marker all_reduce in each tensor-parallel pair, the data-parallel
all_reduce after it, every pass), ranks 0 and 1 skipping one pass's data-parallel call, with
CALLS recorded calls per rank. Built as typed events (the loader's output), so that the figure
is the pass alone; the silent watch pays it once per look at a running job (docs/
silent-errors.md: it waits ten times the last look's cost between two).

    python benchmarks/step_skew_cost.py [--ranks 8] [--calls 20000,100000,200000] [--rounds 3]

The last line is

  step_skew_cost us_per_call=U seconds_at_largest=S
"""

from __future__ import annotations

import argparse
import statistics
import time

from nccl_doctor.analysis.silent.step_skew import detect_step_skew
from nccl_doctor.location import Location
from nccl_doctor.model import (
    Event, EventFlag, EventKind, EventState, ExitKind, GroupInfo, Integrity, RankExit, RankMeta,
    RankTrace, TraceSet,
)

T0, STEP = 1_700_000_000_000_000_000, 1_000_000
MARKER, CALL = Location("/job/train.py", 40, "main"), Location("/job/train.py", 44, "main")


def _event(idx: int, group: str, seq: int, site: Location) -> Event:
    t = T0 + idx * STEP
    return Event(idx=idx, parent=0, kind=EventKind.COLLECTIVE, op="all_reduce", group=group,
                 seq=seq, seq_offset=0, seq_delta=1, state=EventState.RETURNED,
                 flags=EventFlag.NONE, t_enter_ns=t, t_exit_ns=t + STEP // 2, thread=1,
                 input="float32[8]", output="", nbytes=32, peer=-1, group_size=2,
                 callsite=site, api_callsite=site)


def _rank(rank: int, ranks: int, calls: int) -> RankTrace:
    skips = rank < 2  # ranks 0, 1 skip pass 3's data-parallel call and run one pass more
    events, idx, seq = [], 0, {"m": 0, "s": 0}
    for n in range(1, calls // 2 + (2 if skips else 1)):
        idx += 1
        seq["m"] += 1
        events.append(_event(idx, f"tp{rank // 2}", seq["m"], MARKER))
        if not (skips and n == 3):
            idx += 1
            seq["s"] += 1
            events.append(_event(idx, f"dp{rank % 2}", seq["s"], CALL))
    meta = RankMeta(rank=rank, world_size=ranks, local_rank=rank, node_rank=0, host="node0",
                    pid=1000 + rank, started_ns=T0)
    return RankTrace(meta=meta, events=tuple(events), exit=RankExit(ExitKind.CLEAN, code=0),
                     integrity=Integrity(), path=f"rank{rank}.ndcap")


def job(ranks: int, calls: int) -> TraceSet:
    groups = {f"tp{i}": tuple(range(2 * i, 2 * i + 2)) for i in range(ranks // 2)}
    groups.update({f"dp{j}": tuple(range(j, ranks, 2)) for j in range(2)})
    return TraceSet(ranks={r: _rank(r, ranks, calls) for r in range(ranks)},
                    groups={n: GroupInfo(n, g, "gloo") for n, g in groups.items()},
                    world_size=ranks, command=("train.py",), exit_status=0, problems=(),
                    source="synthetic")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ranks", type=int, default=8)
    ap.add_argument("--calls", default="20000,100000,200000")
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    per_call, largest = [], 0.0
    for calls in (int(c) for c in args.calls.split(",")):
        traces = job(args.ranks, calls)
        times = []
        for _ in range(args.rounds):
            t = time.perf_counter()
            found = detect_step_skew(traces)
            times.append(time.perf_counter() - t)
        assert len(found) == 1, found  # the skew is read at every size
        best = min(times)
        total = sum(len(t.events) for t in traces.ranks.values())
        per_call.append(best / total * 1e6)
        largest = best
        print(f"{args.ranks} ranks x {calls:,} calls ({total:,} in all): best {best:.2f} s, "
              f"median {statistics.median(times):.2f} s, {best / total * 1e6:.2f} us a call")
    print(f"step_skew_cost us_per_call={max(per_call):.2f} seconds_at_largest={largest:.2f}")


if __name__ == "__main__":
    main()
