"""Multi-node supervision at scale: what the nodes send per look and what the leader pays.

Part 1 (synthetic, ``--nodes 16,128,1024``): a leader hosts the coordinator's TCPStore in this
process; N followers are simulated by writing exactly what a follower writes (one beat per node
and, as when the job is quiet, one summary of its ``--ranks`` ranks, each rank's capture holding
``--events`` calls) with nccl-doctor's own code (capture/summary.py, federation/link.py). Then
the leader's side is timed, as its supervisor does it:

  look       Leader.gather(): every beat in one round trip, parsed (every tick of a running job)
  traces     every summary fetched and parsed (what a quiet job of up to 16 nodes sends)
  analysis   the union with the leader's own ranks, and analyze() on it (the watchdog's look)
  deadlock   at more than 16 nodes, the leader's first look at the quiet job as it is made:
             Leader.remote_traces() reads every node's digest, asks the nodes of the ranks the
             digests make suspect for their summaries (answered, as a follower answers, at its
             next beat: the benchmark's responder thread polls every node's request every
             0.5 s), then analyze() on the union - cold, the first time (a deadlock happens
             once) - and whether it names the culprit with its line
  straggler  the straggler pass alone (detect_straggler and the lateness table) on that union,
             whose node 1 is slow: its ranks arrive 50 ms late at every call, and every node's
             clock is off by its own number of seconds (the pass compares no clocks)

and the bytes: one beat, one summary, per node and in all per look. Each size runs twice: the
store unauthenticated, then with a federation key (every value sealed and checked, HMAC-SHA256),
so the look's cost of authentication is the difference.

Part 2 (``--live N``): N real runs of two simulated hosts (reproducers/nodes.py --doctor, UTS
namespaces) where global rank 3 on nodeB skips a broadcast; prints how long after the last
progress the leader called the deadlock (report.json's ``watchdog.waited_s``).

    python benchmarks/federation.py [--nodes 16,128,1024] [--ranks 8] [--events 2000]
        [--repeat 5] [--live 0]
"""

from __future__ import annotations

import argparse
import json
import threading
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from nccl_doctor.analysis import analyze
from nccl_doctor.analysis.slow.lateness import lateness_table
from nccl_doctor.analysis.slow.straggler import detect_straggler
from nccl_doctor.analysis.slow.waits import detect_slow_node_from_waits
from nccl_doctor.capture import summary
from nccl_doctor.capture.union import union
from nccl_doctor.location import Location
from nccl_doctor.model import (
    Event, EventFlag, EventKind, EventState, ExitKind, GroupInfo, Integrity, RankExit, RankMeta,
    RankTrace, TraceSet,
)
from nccl_doctor.reproducers.nodes import free_port
from nccl_doctor.supervisor.federation import keys, sealing
from nccl_doctor.supervisor.federation import store as st
from nccl_doctor.supervisor.federation.link import new_link
from nccl_doctor.supervisor.federation.rendezvous import Rendezvous

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _results import record  # noqa: E402

SITE = Location("/job/train.py", 120, "train_step")


SLOW_NODE = 1  # its ranks arrive 50 ms late at every call (the straggler pass names it)


def rank_trace(rank: int, world: int, node: int, ranks: int, events: int,
               culprit: int) -> RankTrace:
    """A rank that made ``events`` all_reduce calls and waits in the last one; ``culprit``
    waits in a broadcast there instead. Each node's clock is off by ``node`` seconds; the ranks
    of ``SLOW_NODE`` wait 0.5 ms in each call, every other rank 50.5 ms (it waited for them)."""
    out = []
    clock = 1_700_000_000_000_000_000 + node * 1_000_000_000
    wait = 500_000 if node == SLOW_NODE else 50_500_000
    for i in range(1, events + 1):
        last = i == events
        op = "broadcast" if last and rank == culprit else "all_reduce"
        enter = clock + i * 100_000_000 + (50_000_000 if node == SLOW_NODE else 0)
        out.append(Event(
            i, 0, EventKind.COLLECTIVE, op, "0", i, 0, None if last else 1,
            EventState.ENTERED if last else EventState.RETURNED, EventFlag.NONE,
            enter, None if last else enter + wait, 1, "float32[1024]", "",
            4096, 0 if op == "broadcast" else -1, world, SITE, SITE))
    meta = RankMeta(rank, world, rank % ranks, node, f"node{node:04d}", 10_000 + rank, 1)
    notes = ({"note": "group", "name": "0", "ranks": list(range(world)), "backend": "gloo"},)
    return RankTrace(meta, tuple(out), RankExit(ExitKind.RUNNING), Integrity(),
                     f"/out/rank{rank:05d}.ndcap", notes)


def synthetic(nodes: int, ranks: int, events: int, repeat: int, key: bytes | None) -> dict:
    world = nodes * ranks
    culprit = world - 1
    port = free_port()
    rdzv = Rendezvous("127.0.0.1", port, nodes, 0, "benchmark", f"127.0.0.1:{port - 1000}")
    leader = new_link(rdzv, "leader", leader=True, announce=lambda _m: None, answer=lambda *a: {},
                  summaries=lambda ended: [], key=key)
    leader.start()
    leader.wait_started(60)
    store = leader.t.store  # the followers' writes, as a Follower makes them (sealed
    # under the key, when there is one)
    beat_bytes = summary_bytes = digest_bytes = 0
    t0 = time.perf_counter()
    ids = []
    for node in range(1, nodes):
        nid = f"node{node:04d}-{node}"
        ids.append(nid)
        traces = [rank_trace(node * ranks + r, world, node, ranks, events, culprit)
                  for r in range(ranks)]
        counts = {str(node * ranks + r): events for r in range(ranks)}
        doc = {"v": 1, "ranks": [summary.summarize(t) for t in traces], "counts": counts}
        dig = {"v": 1, "ranks": [summary.digest(t) for t in traces], "counts": counts}
        beat = {"n": 1, "t": time.time(), "host": f"node{node:04d}", "node_rank": node,
                "counts": counts, "notes": {k: 0 for k in counts}, "down": [], "ended": False,
                "summary": 0, "digest": 1}  # quiet: its digest sent, its summary on request
        text_b, text_s, text_d = (json.dumps(x, separators=(",", ":")) for x in (beat, doc, dig))
        beat_bytes, summary_bytes, digest_bytes = len(text_b), len(text_s), len(text_d)
        st.put(store, st.summary_key(nid), doc)
        st.put(store, st.digest_key(nid), dig)
        st.put(store, st.beat_key(nid), beat)
        st.put(store, st.request_key(nid), {})  # (as a follower does when it joins)
        st.put(store, st.node_key(st.add(store, st.NODES, 1)), nid)
    setup = time.perf_counter() - t0
    own = TraceSet({r: rank_trace(r, world, 0, ranks, events, culprit) for r in range(ranks)},
                   {"0": GroupInfo("0", tuple(range(world)), "gloo")}, world)

    # the deadlock look, first and cold, as the leader makes it at more than 16 nodes
    stop = threading.Event()
    # (the followers' own connection: one client of the store is not shared between threads)
    theirs = sealing.sealed(st.open_store("127.0.0.1", port, leader=False, timeout=30.0), key,
                            sealing.nonce_of(store))  # (the names of this run's nonce)
    responder = threading.Thread(target=_respond, args=(theirs, ids, stop), daemon=True)
    responder.start()
    leader.gather()
    t = time.perf_counter()
    lean_traces = leader.remote_traces(fresh=True)
    lean_fetch = time.perf_counter() - t
    asked = sum(1 for r in leader.remotes.values() if r.summarized)
    t = time.perf_counter()
    d = analyze(union([own, TraceSet({tr.rank: tr for tr in lean_traces}, {}, world)]),
                annotators=())
    lean_analysis = time.perf_counter() - t
    stop.set()
    responder.join()
    lean_root = d.root_cause
    lean_line = bool(lean_root and lean_root.callsite == f"{SITE.path}:{SITE.line}")
    # the straggler watch's look while the job runs at scale: every node's new digest (each
    # node sends one every 10 s while its ranks move), and the slow node named from their waits
    for remote in leader.remotes.values():
        remote.digest_version = 0
    t = time.perf_counter()
    moving = leader.remote_traces(fresh=False)
    digests_s = time.perf_counter() - t
    t = time.perf_counter()
    named = detect_slow_node_from_waits(union([own, TraceSet({tr.rank: tr for tr in moving},
                                                             {}, world)]))
    waits_s = time.perf_counter() - t
    waits_slow = named[0].evidence.node["host"] if named else "none"

    looks, fetches, cached, analyses, passes = [], [], [], [], []
    root = slow = None
    for i in range(repeat):
        t = time.perf_counter()
        leader.gather()
        looks.append(time.perf_counter() - t)
        t = time.perf_counter()
        remote_traces = _every_summary(leader)
        fetches.append(time.perf_counter() - t)
        t = time.perf_counter()
        leader.remote_traces(fresh=False)
        cached.append(time.perf_counter() - t)
        t = time.perf_counter()
        part = TraceSet({tr.rank: tr for tr in remote_traces}, {}, world)
        job = union([own, part])
        d = analyze(job, annotators=())
        analyses.append(time.perf_counter() - t)
        root = d.root_cause
        job = union([own, part])  # a fresh look: nothing the analysis kept is reused
        t = time.perf_counter()
        found = detect_straggler(job)
        lateness_table(job)
        passes.append(time.perf_counter() - t)
        slow = found[0].evidence.get("node", {}).get("host") if found else None
    leader.close()
    return {
        "nodes": nodes, "ranks": world, "setup_s": setup, "beat_bytes": beat_bytes,
        "digest_bytes": digest_bytes, "lean_fetch_s": lean_fetch,
        "lean_analysis_s": lean_analysis, "asked": asked,
        "lean_right": bool(lean_root and lean_root.ranks == (culprit,)) and lean_line,
        "digests_s": digests_s, "waits_s": waits_s, "waits_slow": waits_slow,
        "summary_bytes": summary_bytes, "look_ms": statistics.median(looks) * 1e3,
        "fetch_s": statistics.median(fetches), "cached_ms": statistics.median(cached) * 1e3,
        "analysis_s": statistics.median(analyses),
        "straggler_s": statistics.median(passes), "slow": slow or "none",
        "slow_right": slow == f"node{SLOW_NODE:04d}", "rejected": leader.t.rejected,
        "root": f"{root.kind.value} ranks {list(root.ranks)}" if root else "none",
        "right": bool(root and root.ranks == (culprit,)),
    }


def _respond(store, ids: list[str], stop: threading.Event, every: float = 0.5) -> None:
    """The followers' side of a request: each polls its request key once a beat (``every``)
    and answers that its summary (already in the store, as a follower publishes it before it
    answers) is there."""
    done: dict[str, int] = {}
    while not stop.is_set():
        for nid, req in zip(ids, st.get_many(store, [st.request_key(n) for n in ids])):
            if isinstance(req, dict) and req.get("n", 0) > done.get(nid, 0):
                done[nid] = req["n"]
                st.put(store, st.response_key(nid, req["n"]), {"v": 1})
        stop.wait(every)


def _every_summary(leader) -> list:
    """Every node's summary fetched and parsed (what a quiet job of up to 16 nodes sends)."""
    for remote in leader.remotes.values():
        remote.version, remote.traces = 0, {}
        remote.beat = {**remote.beat, "summary": 1}
    return leader.remote_traces(fresh=False)


def live(runs: int) -> list[float]:
    out = []
    job = Path(__file__).resolve().parent.parent / "tests/integration/jobs/skip_broadcast.py"
    for _ in range(runs):
        with tempfile.TemporaryDirectory() as tmp:
            subprocess.run([sys.executable, "-m", "nccl_doctor.reproducers.nodes", "--doctor",
                            tmp, "--hosts", "nodeA,nodeB", "--script", str(job)],
                           env=dict(os.environ, SKIPPER="3"), capture_output=True, timeout=300)
            rep = json.loads((Path(tmp) / "nodeB" / "report.json").read_text())
            out.append(float(rep["watchdog"]["waited_s"]))
    return out


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--nodes", default="16,128,1024")
    p.add_argument("--ranks", type=int, default=8, help="ranks per node")
    p.add_argument("--events", type=int, default=2000, help="calls in each rank's capture")
    p.add_argument("--repeat", type=int, default=5)
    p.add_argument("--live", type=int, default=0, help="real two-host runs to time")
    a = p.parse_args()
    print(f"{'nodes':>6} {'ranks':>6} {'key':>4} {'beat B':>7} {'summary B':>10} "
          f"{'look ms':>8} {'look KB':>8} {'fetch s':>8} {'cached ms':>9} {'analysis s':>10} "
          f"{'straggler s':>11}  root cause; slow node")
    lean = []
    for n in (int(x) for x in a.nodes.split(",")):
        for key in (None, keys.new_key()):
            r = synthetic(n, a.ranks, a.events, a.repeat, key)
            print(f"{r['nodes']:>6} {r['ranks']:>6} {'yes' if key else 'no':>4} "
                  f"{r['beat_bytes']:>7} {r['summary_bytes']:>10} "
                  f"{r['look_ms']:>8.1f} {r['beat_bytes'] * (n - 1) / 1024:>8.0f} "
                  f"{r['fetch_s']:>8.2f} {r['cached_ms']:>9.1f} {r['analysis_s']:>10.2f} "
                  f"{r['straggler_s']:>11.2f}  {r['root']} "
                  f"({'right' if r['right'] else 'WRONG'}); {r['slow']} "
                  f"({'right' if r['slow_right'] else 'WRONG'}); rejected {r['rejected']}",
                  flush=True)
            lean.append((n, key, r))
    print("\nat more than 16 nodes: the deadlock look (every digest, the suspects' summaries) "
          "and the straggler look (every digest, the slow node from their waits)")
    print(f"{'nodes':>6} {'key':>4} {'digest B':>9} {'all digests KB':>15} {'asked':>6} "
          f"{'fetch s':>8} {'analysis s':>10} {'look s':>7}  {'culprit':>7} "
          f"{'digests s':>9} {'waits s':>8} {'B/node/s':>9}  slow node")
    for n, key, r in lean:
        per_node = 2 * r["beat_bytes"] + r["digest_bytes"] / 10  # a beat every 0.5 s, a
        print(f"{n:>6} {'yes' if key else 'no':>4} {r['digest_bytes']:>9} "  # digest every 10 s
              f"{r['digest_bytes'] * (n - 1) / 1024:>15.0f} {r['asked']:>6} "
              f"{r['lean_fetch_s']:>8.2f} {r['lean_analysis_s']:>10.2f} "
              f"{r['lean_fetch_s'] + r['lean_analysis_s']:>7.2f}  "
              f"{'right' if r['lean_right'] else 'WRONG':>7} {r['digests_s']:>9.2f} "
              f"{r['waits_s']:>8.2f} {per_node:>9.0f}  {r['waits_slow']} "
              f"({'right' if r['waits_slow'] == f'node{SLOW_NODE:04d}' else 'WRONG'})",
              flush=True)
    n, key, r = max(lean, key=lambda x: (x[0], x[1] is not None))  # the most nodes, with a key
    line = (f"federation nodes={n} ranks={r['ranks']} key={'yes' if key else 'no'} "
            f"deadlock_look_s={r['lean_fetch_s'] + r['lean_analysis_s']:.2f} "
            f"culprit={'right' if r['lean_right'] else 'wrong'} digests_s={r['digests_s']:.2f} "
            f"waits_s={r['waits_s']:.2f} "
            f"slow={'right' if r['waits_slow'] == f'node{SLOW_NODE:04d}' else 'wrong'} "
            f"bytes_per_node_s={2 * r['beat_bytes'] + r['digest_bytes'] / 10:.0f}")
    print(line)
    record(line)
    if a.live:
        waits = live(a.live)
        print(f"two hosts, rank 3 on nodeB skips a broadcast: deadlock called "
              f"{', '.join(f'{w:.1f}' for w in waits)} s after the last progress "
              f"(median {statistics.median(waits):.1f} s)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
