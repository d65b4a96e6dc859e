"""The nodes' link over a real torch TCPStore, leader and followers in one process (no job):
joining, beats, summaries, requests, decisions, a lost follower, a lost leader, the end."""

from __future__ import annotations

import json
import threading
import time

from nccl_doctor.analysis.calls.ends import Ending, with_ends_known
from nccl_doctor.model import ExitKind, TraceSet, Unrecorded
from nccl_doctor.reproducers.nodes import free_port
from nccl_doctor.supervisor.federation.link import LinkState, Local, Role, new_link
from nccl_doctor.supervisor.federation.rendezvous import Rendezvous


def rdzv(port: int, node: int) -> Rendezvous:
    return Rendezvous("127.0.0.1", port, 2, node, "test", "127.0.0.1:1")


def leader_and_follower(port: int, said: list[str], brief=None, **opts):
    leader = new_link(rdzv(port, 0), "nodeA", leader=True, announce=said.append, answer=lambda *a: {},
                  summaries=lambda ended: {"ranks": []}, every=0.05, **opts)
    answers = []

    def answer(what, ranks, timeout):
        answers.append((what, ranks))
        return {"ranks": {str(r): f"{what} of {r}" for r in ranks}}

    follower = new_link(rdzv(port, 1), "nodeB", leader=False, announce=said.append, answer=answer,
                    summaries=lambda ended: brief or {"ranks": []}, every=0.05, quiet_for=0.05,
                    **opts)
    leader.start()
    leader.wait_started(60)
    follower.start()
    return leader, follower, answers


def until(predicate, timeout=30.0):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if predicate():
            return True
        time.sleep(0.05)
    return False


def test_a_follower_joins_beats_answers_and_gets_the_decisions():
    said: list[str] = []
    leader, follower, answers = leader_and_follower(free_port(), said)
    local = Local({2: 10, 3: 11}, {2: 0, 3: 0}, (), False, 1)
    assert until(lambda: follower.follow(local) is not None and follower.t.state is LinkState.JOINED)
    assert any("joined the job's nodes" in m and "leader: nodeA" in m for m in said)
    assert until(lambda: (follower.follow(local), leader.gather(), leader.remotes)[2])
    remote = next(iter(leader.remotes.values()))
    assert (remote.host, remote.node_rank, sorted(remote.ranks)) == ("nodeB", 1, [2, 3])
    assert leader.remote_counts()[0] == {2: 10, 3: 11}

    stop = threading.Event()

    def follow_loop():
        while not stop.is_set():
            follower.follow(local)
            time.sleep(0.02)

    loop = threading.Thread(target=follow_loop)
    loop.start()
    try:
        got = leader.request("stacks", [3], 5.0)
        leader.publish({"kind": "hang", "announce": ["HANG: x"]})
    finally:
        stop.set()
        loop.join()
    assert got == {"3": "stacks of 3"} and answers == [("stacks", [3])]
    decisions = []
    assert until(lambda: decisions.extend(follower.follow(local)) or decisions)
    assert decisions == [{"kind": "hang", "announce": ["HANG: x"]}]
    leader.close()
    follower.close()


def test_a_followers_unrecorded_ranks_reach_the_leader_with_why():
    """A rank of the follower that could not make its capture (capture/unrecorded.py) is in its
    summary: the leader counts it as run unseen, not as a rank of a node that never joined. What
    makes no sense in the summary (a rank that is no number, one with a capture, a reason that
    is not text) is not believed; a long reason is cut."""
    said: list[str] = []
    why = "it cannot create its capture in /out (No space left on device)"
    entry = {"why": why, "host": "nodeB"}
    brief = {"ranks": [], "unrecorded": {
        "3": entry, "x": entry, "²": entry, "-1": entry, "5": why, "6": {"why": 6},
        "7": {"why": "y" * 10_000, "host": 7}, "99999999": entry}}
    leader, follower, _ = leader_and_follower(free_port(), said, brief)
    local = Local({2: 10}, {}, (), False, 1)
    assert until(lambda: (follower.follow(local), leader.gather(), leader.remote_traces(),
                          leader.remote_unrecorded())[3])
    got = leader.remote_unrecorded()
    assert got == {3: Unrecorded(why, "nodeB"), 7: Unrecorded("y" * 500)}
    leader.close()
    follower.close()


def test_a_silent_follower_is_lost_with_its_ranks_summarised_or_not():
    said: list[str] = []
    leader, follower, _ = leader_and_follower(free_port(), said, lost_after=0.5)
    local = Local({2: 10, 3: 11}, {}, (), False, 1)
    assert until(lambda: (follower.follow(local), leader.gather(), leader.remotes)[2])
    follower.close()  # it stops beating, as a SIGKILLed node does
    assert until(lambda: (leader.gather(), any(r.lost for r in leader.remotes.values()))[1])
    assert any(m.startswith("LOST: nodeB (node 1)") for m in said)
    remote = leader.remote_traces()
    assert sorted(t.rank for t in remote) == [2, 3]  # it never sent a summary: still named
    assert set(leader.lost_ranks()) == {2, 3}
    job = with_ends_known(TraceSet(ranks={t.rank: t for t in remote}, groups={}, world_size=4),
                  Ending(lost=leader.lost_ranks()))
    lost = list(job.ranks.values())
    assert all(t.exit.kind is ExitKind.LOST and t.meta.host == "nodeB" for t in lost)
    assert leader.all_ended()
    leader.close()


def test_a_lost_leader_leaves_the_follower_alone_and_says_so():
    said: list[str] = []
    port = free_port()
    leader, follower, _ = leader_and_follower(port, said)
    local = Local({2: 1}, {}, (), False, 1)
    assert until(lambda: (follower.follow(local), follower.t.state is LinkState.JOINED)[1])
    leader.publish_roster({0: ("nodeA", 0), 1: ("nodeA", 0)})
    assert until(lambda: (follower.follow(local), follower.leader_ranks())[1])
    assert follower.leader_ranks() == {0: ("nodeA", 0), 1: ("nodeA", 0)}
    del leader.t.store, leader.t.pending  # the leader's process is gone: its store with it
    import gc
    gc.collect()
    assert until(lambda: (follower.follow(local), follower.t.state is LinkState.LEADER_LOST)[1])
    assert "the leader (nodeA) was lost" in follower.t.problem
    assert follower.follower_finish(local, 1.0) is None
    assert follower.role is Role.FOLLOWER


def test_the_final_report_reaches_a_follower_that_ended():
    said: list[str] = []
    leader, follower, _ = leader_and_follower(free_port(), said)
    local = Local({2: 5}, {}, (), False, 1)
    assert until(lambda: (follower.follow(local), leader.gather(), leader.remotes)[2])
    got = {}
    t = threading.Thread(target=lambda: got.setdefault(
        "final", follower.follower_finish(Local({2: 6}, {}, (), True, 1), 30.0)))
    t.start()
    assert until(lambda: (leader.gather(), leader.all_ended())[1])
    final = {"verdict": "ok", "ranks": [{"rank": 2, "host": "nodeB", "state": "exited"}]}
    leader.publish_final(final, wait=10.0)
    t.join(30)
    assert got["final"] == final
    leader.close()


def test_a_final_report_blind_to_the_followers_ranks_is_not_taken():
    """A leader that gave up on this node before it joined reports its ranks unseen: the
    follower keeps its own report (it sees them), and says why."""
    said: list[str] = []
    leader, follower, _ = leader_and_follower(free_port(), said)
    local = Local({2: 5, 3: 5}, {}, (), False, 1)
    assert until(lambda: (follower.follow(local), leader.gather(), leader.remotes)[2])
    got = {}
    t = threading.Thread(target=lambda: got.setdefault(
        "final", follower.follower_finish(Local({2: 6, 3: 6}, {}, (), True, 1), 30.0)))
    t.start()
    assert until(lambda: (leader.gather(), leader.all_ended())[1])
    leader.publish_final({"verdict": "crash", "ranks": [
        {"rank": 2, "host": "nodeB", "state": "exited"},
        {"rank": 3, "host": "", "state": "no_capture"}]}, wait=10.0)
    t.join(30)
    assert got["final"] is None
    assert "made before this node joined" in follower.t.problem
    leader.close()


def test_a_follower_still_loading_torch_at_its_jobs_end_still_joins():
    """On a host so loaded that its link has not made one attempt when its node's job ends
    (loading torch.distributed took longer than the join window), the follower waits on, and
    the leader, told by Ray's keeper that this node's doctor runs, waits for it past the
    window: the final report sees every node."""
    said: list[str] = []
    port = free_port()
    leader = new_link(rdzv(port, 0), "nodeA", leader=True, announce=said.append, answer=lambda *a: {},
                  summaries=lambda ended: {"ranks": []}, every=0.05, connect_within=0.3)
    leader.start()
    leader.wait_started(60)
    follower = new_link(rdzv(port, 1), "nodeB", leader=False, announce=said.append, answer=lambda *a: {},
                    summaries=lambda ended: {"ranks": []}, every=0.05, quiet_for=0.05,
                    connect_within=0.3)  # its link thread not started yet: still "loading"
    leader.coming("nodeB")
    time.sleep(0.5)  # both join windows are over
    assert not (leader.gather(), leader.all_ended())[1], "gave up on a node doctor that runs"
    got = {}
    ended = Local({2: 6}, {}, (), True, 1)
    t = threading.Thread(target=lambda: got.setdefault(
        "final", follower.follower_finish(ended, 30.0)))
    t.start()
    time.sleep(1.0)
    assert t.is_alive(), "the follower gave up before it had tried"
    follower.start()  # torch loaded at last: it reaches the leader
    assert until(lambda: (leader.gather(), leader.all_ended())[1])
    assert [r.host for r in leader.remotes.values()] == ["nodeB"]
    final = {"verdict": "ok", "ranks": [{"rank": 2, "host": "nodeB", "state": "exited"}]}
    leader.publish_final(final, wait=10.0)
    t.join(30)
    assert got["final"] == final
    leader.close()
    follower.close()


def test_the_leader_stops_waiting_for_a_node_doctor_that_ended_unjoined():
    said: list[str] = []
    leader = new_link(rdzv(free_port(), 0), "nodeA", leader=True, announce=said.append, answer=lambda *a: {},
                  summaries=lambda ended: {"ranks": []}, every=0.05, connect_within=0.3)
    leader.start()
    leader.wait_started(60)
    leader.coming("nodeB")
    time.sleep(0.5)
    assert not (leader.gather(), leader.all_ended())[1]
    leader.gone("nodeB")  # its doctor exited (refused, lost with its node): nothing to wait for
    assert leader.all_ended()
    leader.close()


def _rank(rank: int, world: int, node: int, culprit: int, calls: int = 40):
    """A rank of a hung job: ``calls`` all_reduce calls of the world group, waiting in the last;
    ``culprit`` waits in a broadcast there instead, from its own line."""
    from nccl_doctor.location import Location
    from nccl_doctor.model import (Event, EventFlag, EventKind, EventState, Integrity, RankExit,
                                   RankMeta, RankTrace)

    out = []
    for i in range(1, calls + 1):
        last = i == calls
        odd = last and rank == culprit
        site = Location("/job/train.py", 77 if odd else 120, "train_step")
        enter = 1_700_000_000_000_000_000 + i * 10**8
        out.append(Event(i, 0, EventKind.COLLECTIVE, "broadcast" if odd else "all_reduce", "0",
                         i, 0, None if last else 1,
                         EventState.ENTERED if last else EventState.RETURNED, EventFlag.NONE,
                         enter, None if last else enter + 10**6, 1, "float32[8]", "", 32,
                         0 if odd else -1, world, site, site))
    notes = ({"note": "group", "name": "0", "ranks": list(range(world)), "backend": "gloo"},
             {"note": "rng", "label": "seed", "seed": 0})
    return RankTrace(RankMeta(rank, world, rank % 2, node, f"node{node}", 100 + rank, 1),
                     tuple(out), RankExit(ExitKind.RUNNING), Integrity(), "", notes)


def test_at_scale_a_quiet_node_sends_a_digest_and_only_the_suspects_summaries_travel():
    """A job of more than FULL_NODES nodes (3 followers of 2 ranks here; the rendezvous says 64):
    a quiet follower sends its ranks' digests, not their summaries. The leader reads every
    digest and asks for a full summary only the node whose rank parts from its group (it waits
    in a broadcast where the others wait in an all_reduce); the analysis of the union names that
    rank at its line. A digest is a fraction of a summary."""
    import json

    from nccl_doctor.analysis import analyze
    from nccl_doctor.capture import summary
    from nccl_doctor.supervisor.federation.follower import FULL_NODES

    nnodes, world, culprit = 64, 8, 5
    port = free_port()
    said: list[str] = []

    def at(node: int) -> Rendezvous:
        return Rendezvous("127.0.0.1", port, nnodes, node, "test", "127.0.0.1:1")

    assert nnodes > FULL_NODES
    leader = new_link(at(0), "node0", leader=True, announce=said.append,
                      answer=lambda *a: {}, summaries=lambda ended: {"ranks": []}, every=0.05)
    leader.start()
    leader.wait_started(60)
    asked: dict[int, list[bool]] = {}
    followers = []
    for node in (1, 2, 3):
        ranks = [_rank(r, world, node, culprit) for r in (2 * node, 2 * node + 1)]

        def brief(ended, lean=False, ranks=ranks, node=node):
            asked.setdefault(node, []).append(lean)
            make = summary.digest if lean else summary.summarize
            return {"ranks": [make(t) for t in ranks]}

        link = new_link(at(node), f"node{node}", leader=False, announce=said.append,
                        answer=lambda *a: {}, summaries=brief, every=0.05, quiet_for=0.05)
        link.start()
        followers.append([link, Local({t.rank: 39 for t in ranks}, {}, (), False, node)])
    stop = threading.Event()

    def follow_loop():
        while not stop.is_set():
            for link, local in followers:
                link.follow(local)
            time.sleep(0.02)

    loop = threading.Thread(target=follow_loop)
    loop.start()
    try:  # (a joining node sends its summary once; then its ranks make their last call)
        assert until(lambda: (leader.gather(), len(leader.remotes) == 3
                              and all(r.beat.get("summary") for r in leader.remotes.values()))[1])
        for pair in followers:
            pair[1] = Local({r: 40 for r in pair[1].counts}, {}, (), False, pair[1].node_rank)
        assert until(lambda: (leader.gather(), all(
            r.beat.get("digest") and r.beat.get("counts") == {k: 40 for k in r.beat["counts"]}
            for r in leader.remotes.values()))[1])
        remote = leader.remote_traces()
    finally:
        stop.set()
        loop.join()
    by_host = {r.host: r for r in leader.remotes.values()}
    assert by_host["node2"].summarized  # the culprit's node: its summary was asked for
    assert not by_host["node1"].summarized and not by_host["node3"].summarized
    assert asked[2] == [False, True, False] and asked[1] == asked[3] == [False, True]
    assert sorted(t.rank for t in remote) == [2, 3, 4, 5, 6, 7]
    own = {r: _rank(r, world, 0, culprit) for r in (0, 1)}
    job = TraceSet(ranks={**own, **{t.rank: t for t in remote}}, groups={}, world_size=world)
    root = analyze(job, annotators=()).root_cause
    assert root is not None and root.ranks == (culprit,)
    assert root.callsite == "/job/train.py:77"
    digests = [t for t in remote if t.rank != culprit and t.rank // 2 != 2]
    assert all(len(t.events) == 1 and [n["note"] for n in t.notes] == ["group", "waits"]
               for t in digests)  # each group's last call, its layout, the waits: no seeds
    full, lean = (len(json.dumps(f(_rank(2, world, 1, culprit)))) for f in (summary.summarize,
                                                                             summary.digest))
    assert lean * 3 < full, (lean, full)
    leader.close()
    for link, _ in followers:
        link.close()


def test_a_digest_reads_back_as_each_groups_last_call_with_its_lateness_window():
    from nccl_doctor.capture import summary

    trace = _rank(3, 8, 1, culprit=-1, calls=100)
    back = summary.unsummarize(summary.digest(trace))
    (waits,) = [n for n in back.notes if n["note"] == "waits"]
    assert waits["groups"] == {"0": [summary.WAITS - 1, (summary.WAITS - 1) * 10**6]}
    (last,) = back.events
    assert (last.seq, last.op, last.state) == (100, "all_reduce", trace.events[-1].state)
    assert back.exit.kind is ExitKind.RUNNING and back.meta.host == "node1"
    assert back.meta.sources == {} and back.meta.versions == {}


def test_with_a_key_the_follower_believes_the_nonce_the_leader_proves_not_a_replayed_one():
    """With the job's key, something replays an earlier run's join record (the same key: its
    name and MAC are good, its nonce is old) over the leader's, again and again, from before the
    follower comes. The follower joins only under the nonce the leader answers its challenge
    with; the leader writes its record back each look and counts each overwrite; then the link
    works as without a key - requests, decisions, the final report - on names nobody else knows."""
    from nccl_doctor.supervisor.federation import sealing
    from nccl_doctor.supervisor.federation import store as st

    said: list[str] = []
    port = free_port()
    key = b"a-static-key-reused-across-runs"
    leader = new_link(rdzv(port, 0), "nodeA", leader=True, announce=said.append,
                      answer=lambda *a: {}, summaries=lambda ended: {"ranks": []}, every=0.05,
                      key=key)
    leader.start()
    leader.wait_started(60)
    replayer = st.open_store("127.0.0.1", port, leader=False, timeout=10.0)
    earlier = sealing.Sealed(replayer, key, "")
    old = earlier.seal(sealing.join_name("127.0.0.1:1"), json.dumps({
        "format": st.FORMAT, "version": st.VERSION, "job": "127.0.0.1:1", "host": "nodeA",
        "nonce": "the-earlier-runs-nonce"}).encode())
    stop = threading.Event()

    def replay():
        while not stop.is_set():
            replayer.set(earlier.name(sealing.join_name("127.0.0.1:1")), old)
            time.sleep(0.03)

    def gather():
        while not stop.is_set():
            leader.gather()
            time.sleep(0.02)

    threads = [threading.Thread(target=replay), threading.Thread(target=gather)]
    for t in threads:
        t.start()
    time.sleep(0.3)
    answers = []
    follower = new_link(rdzv(port, 1), "nodeB", leader=False, announce=said.append,
                        answer=lambda what, ranks, timeout: answers.append(what) or {
                            "ranks": {str(r): what for r in ranks}},
                        summaries=lambda ended: {"ranks": []}, every=0.05, quiet_for=0.05,
                        key=key)
    follower.start()
    local = Local({2: 10, 3: 11}, {}, (), False, 1)
    try:
        assert until(lambda: (follower.follow(local), follower.t.state is LinkState.JOINED)[1],
                     60)
        assert sealing.nonce_of(follower.t.store) == sealing.nonce_of(leader.t.store)
        assert sealing.nonce_of(follower.t.store) != "the-earlier-runs-nonce"
        assert until(lambda: (follower.follow(local), leader.remotes)[1])
    finally:
        stop.set()
        for t in threads:
            t.join()
    assert leader.t.rejected > 0  # the join record found overwritten, each look
    # the table's names hold nothing of the doctors': a process without the key finds nothing
    assert not replayer.check([st.beat_key(follower.t.id)])
    assert not replayer.check([st.node_key(1)])

    loop_stop = threading.Event()

    def follow_loop():
        while not loop_stop.is_set():
            follower.follow(local)
            time.sleep(0.02)

    loop = threading.Thread(target=follow_loop)
    loop.start()
    try:
        remote = next(iter(leader.remotes.values()))
        assert until(lambda: (leader.gather(), leader.t.clock() - remote.seen_at < 0.1)[1])
        assert leader.request("stacks", [3], 5.0) == {"3": "stacks"}
        leader.publish({"kind": "hang", "stop_job": True})
    finally:
        loop_stop.set()
        loop.join()
    decisions: list = []
    assert until(lambda: decisions.extend(follower.follow(local)) or decisions)
    assert decisions == [{"kind": "hang", "stop_job": True}]
    got = {}
    t = threading.Thread(target=lambda: got.setdefault(
        "final", follower.follower_finish(Local({2: 11, 3: 12}, {}, (), True, 1), 30.0)))
    t.start()
    assert until(lambda: (leader.gather(), leader.all_ended())[1])
    final = {"verdict": "ok", "ranks": [{"rank": 2, "host": "nodeB", "state": "exited"},
                                        {"rank": 3, "host": "nodeB", "state": "exited"}]}
    leader.publish_final(final, wait=10.0)
    t.join(30)
    assert got["final"] == final
    leader.close()
    follower.close()
