"""Per-rank collective durations and arrival skew of a recorded job, as a notebook would plot
them with nccl_doctor.open (docs/python-api.md).

    python docs/examples/durations.py RUN_DIR durations.png

RUN_DIR: the --out directory of `nccl-doctor run` (or every node's, or Flight Recorder dumps).
Left: how long each rank spent inside its collectives - the ranks that wait for a late peer
spend the longest. Right: each collective's arrival skew (last rank in minus first), coloured
by the rank that arrived last.
"""

import sys

import matplotlib

matplotlib.use("Agg")  # no screen needed: the figure goes to a file
import matplotlib.pyplot as plt  # noqa: E402

import nccl_doctor  # noqa: E402

job = nccl_doctor.open(sys.argv[1])
calls = job.calls
done = calls[(calls["state"] == "returned") & (calls["kind"] == "collective")]

# every member's arrival at each collective (group, seq): the skew and who came last
arrivals = done.groupby(["group", "seq"], observed=True)["t_enter"]
skew_ms = (arrivals.max() - arrivals.min()).dt.total_seconds() * 1e3
last_rank = done.loc[arrivals.idxmax(), ["group", "seq", "rank"]].set_index(["group", "seq"])
when = arrivals.min()
step = (when - when.min()).dt.total_seconds()

ranks = sorted(done["rank"].unique())
fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4), constrained_layout=True)
left.boxplot([done.loc[done["rank"] == r, "duration_s"] * 1e3 for r in ranks],
             tick_labels=[str(r) for r in ranks], showfliers=False)
left.set_xlabel("rank")
left.set_ylabel("time inside a collective (ms)")
left.set_title("collective durations per rank")
for r in ranks:
    at = last_rank["rank"] == r
    right.scatter(step[at], skew_ms[at], s=12, label=f"rank {r} last")
right.set_xlabel("seconds into the run")
right.set_ylabel("arrival skew (ms)")
right.set_title("arrival skew per collective")
right.legend(fontsize="small")
fig.suptitle(f"{len(skew_ms)} collectives, {len(done)} calls of {len(ranks)} ranks; "
             f"median skew {skew_ms.median():.1f} ms")
fig.savefig(sys.argv[2], dpi=90)
print(f"wrote {sys.argv[2]}: per-rank medians (ms) "
      f"{(done.groupby('rank')['duration_s'].median() * 1e3).round(1).to_dict()}")
