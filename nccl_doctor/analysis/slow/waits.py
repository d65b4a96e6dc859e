"""A slow node named from the nodes' digests alone (pure): what the leader of a job of many
nodes sees live, where every node's recent calls would be too much to fetch every 10 s.

A digest (capture/summary.py) carries, per rank and group, the calls it completed among its last
``WAITS`` and the time it waited in them (a ``waits`` note). In a blocking collective the last
rank to arrive waits the least, so no clock is compared: per group spanning hosts, each host's
ranks' mean wait per call is set against the other hosts'. A node whose ranks wait far less than
the rest - by at least ``MIN_SKEW_NS`` a call, alone so, with the others close to their median -
in most of the groups it shares with other hosts arrives late there: its peers waited about the
difference for it, every call. The finding is a straggler's (its node), a warning; the post
mortem, from the final summaries, measures it again call by call
(analysis/slow/straggler.py).
"""

from __future__ import annotations

import statistics
from collections import defaultdict

from nccl_doctor.analysis.slow.lateness import MIN_SKEW_NS
from nccl_doctor.analysis.slow.straggler import HINT_SLOW_NODE
from nccl_doctor.analysis.calls.wording import duration, ranks_text
from nccl_doctor.diagnosis import Finding, FindingKind, Severity
from nccl_doctor.model import TraceSet

#: Calls a rank must have completed in a group's window for its waits to count.
MIN_CALLS = 8
#: Hosts a group must span: the late one, and enough others to say what is usual.
MIN_HOSTS = 3


def waits_of(traces: TraceSet) -> dict[str, dict[str, list[float]]]:
    """group -> host -> its ranks' mean wait per call (ns), from the ``waits`` notes."""
    out: dict[str, dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
    for t in traces.ranks.values():
        for note in t.notes:
            if note.get("note") != "waits" or not isinstance(note.get("groups"), dict):
                continue
            for group, pair in note["groups"].items():
                if (isinstance(pair, list) and len(pair) == 2 and all(
                        isinstance(x, int) for x in pair) and pair[0] >= MIN_CALLS):
                    out[str(group)][t.meta.host].append(pair[1] / pair[0])
    return out


def detect_slow_node_from_waits(traces: TraceSet) -> list[Finding]:
    late: dict[str, list[float]] = defaultdict(list)  # host -> its lateness a call (ns), per group
    shared: dict[str, int] = defaultdict(int)  # host -> groups it shares with other hosts
    for hosts in waits_of(traces).values():
        if len(hosts) < MIN_HOSTS:
            continue
        means = {h: statistics.fmean(v) for h, v in hosts.items()}
        for h in means:
            shared[h] += 1
        ordered = sorted(means, key=means.__getitem__)
        low, second = means[ordered[0]], means[ordered[1]]
        usual = statistics.median(means[h] for h in ordered[1:])  # the other hosts
        gap = usual - low
        # alone so: the next host waits about as long as the median (it did not arrive late)
        if gap >= MIN_SKEW_NS and second - low >= gap / 2:
            late[ordered[0]].append(gap)
    named = [h for h, gaps in late.items() if len(gaps) * 2 > shared[h]]
    if len(named) != 1:
        return []
    (host,) = named
    gaps = late[host]
    per_call = statistics.median(gaps)
    ranks = tuple(sorted(r for r, t in traces.ranks.items() if t.meta.host == host))
    evidence = {"median_ms": round(per_call / 1e6, 1), "p95_ms": round(max(gaps) / 1e6, 1),
                "considered": len(gaps), "across_hosts": True,
                "node": {"host": host, "ranks": list(ranks), "per_call_s": round(per_call / 1e9, 4),
                         "groups": len(gaps), "from": "digests"}}
    return [Finding(
        kind=FindingKind.STRAGGLER, severity=Severity.WARNING, ranks=ranks, hint=HINT_SLOW_NODE,
        evidence=evidence,
        title=(f"node {host} ({ranks_text(list(ranks))}) is slow: its peers wait "
               f"{duration(per_call / 1e9)} per call for it"),
        detail=(f"Read from the nodes' digests while the job runs: in {len(gaps)} of the "
                f"{shared[host]} process groups it shares with other hosts, its ranks waited "
                f"{duration(per_call / 1e9)} less per call than the other hosts' (the last to "
                "arrive at a blocking collective waits the least; no clocks compared)."))]
