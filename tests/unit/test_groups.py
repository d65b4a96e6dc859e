"""group_mismatch on synthetic traces (analysis/what/groups.py): each rank's group-making calls, as
the recorder notes them, lined up; and the places a stack says a rank waits in
(stacks/places.py)."""

from __future__ import annotations

from dataclasses import replace

from nccl_doctor.analysis.what.groups import detect_group_mismatch, group_calls
from nccl_doctor.diagnosis import FindingKind
from nccl_doctor.location import Location
from nccl_doctor.model import EventKind, EventState
from nccl_doctor.stacks.places import PlaceKind, thread_place
from nccl_doctor.stacks.rank_stack import ThreadStack
from tests.unit.conftest import T0, clean, make_event, make_trace, make_traceset, raised

WORLD = 4


def ranks_trace(rank, calls, *, ended=False, then=None):
    """A rank whose group-making calls are ``calls``: (ranks asked, answered, line); ``then``:
    a collective it entered afterwards."""
    events, notes, count = [make_event(1, group_size=WORLD)], [], 1
    for order, (asked, answered, line) in enumerate(calls):
        idx = len(events) + 1
        t = T0 + idx * 1000
        events.append(make_event(idx, "new_group", kind=EventKind.GROUP, line=line, t_enter_ns=t,
                                 state=EventState.RETURNED if answered else EventState.ENTERED,
                                 group_size=WORLD))
        notes.append({"note": "group_call", "order": order, "op": "new_group", "idx": idx,
                      "ranks": list(asked), "count": count, "time_ns": t})
        if answered:
            member = rank in asked
            notes.append({"note": "group_made", "order": order, "op": "new_group",
                          **({"name": str(count), "ranks": list(asked)} if member
                             else {"member": False}), "time_ns": t + 1})
        count += 1
    if then is not None:
        idx = len(events) + 1
        events.append(make_event(idx, then, state=EventState.ENTERED, group_size=WORLD,
                                 t_enter_ns=T0 + idx * 1000))
    trace = make_trace(rank, events, clean() if ended else None, world_size=WORLD)
    return replace(trace, notes=tuple(notes))


def test_a_group_made_by_its_members_only_names_the_ranks_that_never_made_it():
    traces = make_traceset([
        ranks_trace(0, [((0, 1), True, 7), ((0, 2), False, 8)]),
        ranks_trace(1, [((0, 1), True, 7), ((0, 2), True, 8)], ended=True),
        ranks_trace(2, [((0, 2), False, 8)]),
        ranks_trace(3, [((0, 2), True, 8)], ended=True),
    ])
    (f,) = detect_group_mismatch(traces)
    assert f.kind is FindingKind.GROUP_MISMATCH and f.ranks == (2, 3)
    assert f.title.startswith("ranks 2, 3 never made process group [0, 1]"), f.title
    assert "train.py:7" in f.title
    assert "group [0, 2] is '2' on rank 0 and '1' on rank 2" in f.detail, f.detail


def test_groups_made_in_another_order_say_so_and_the_name_they_share():
    traces = make_traceset([
        ranks_trace(0, [((0, 1), False, 34)]),
        ranks_trace(1, [((0, 1), True, 34), ((2, 3), True, 35)], then="all_reduce"),
        ranks_trace(2, [((2, 3), True, 37), ((0, 1), True, 38)], then="all_reduce"),
        ranks_trace(3, [((2, 3), True, 37), ((0, 1), True, 38)], then="all_reduce"),
    ])
    (f,) = detect_group_mismatch(traces)
    assert "different order" in f.title, f.title
    assert "torch's name '1' is group [0, 1] on ranks 0, 1 and group [2, 3] on ranks 2, 3" \
        in f.detail, f.detail


def test_a_rank_that_went_on_without_a_group_its_peers_wait_inside():
    traces = make_traceset([
        ranks_trace(0, [((0, 1), True, 40), ((2, 3), True, 41)], then="all_reduce"),
        ranks_trace(2, [((0, 1), True, 40), ((2, 3), False, 41)]),
        ranks_trace(3, [], then="all_reduce"),
    ])
    (f,) = detect_group_mismatch(traces)
    assert f.ranks == (3,) and "rank 3 never made process group [2, 3]" in f.title, f.title
    assert "rank 2 waits inside it" in f.title


def test_the_same_groups_in_the_same_order_and_behind_ranks_are_no_mismatch():
    same = [((0, 1), True, 7), ((0, 2), True, 8)]
    assert detect_group_mismatch(make_traceset(
        [ranks_trace(r, same, ended=True) for r in range(WORLD)])) == []
    # a rank still inside its first group, the others ahead of it: behind, not parted
    behind = make_traceset([ranks_trace(0, [((0, 1), False, 7)])]
                           + [ranks_trace(r, same) for r in (1, 2, 3)])
    assert detect_group_mismatch(behind) == []
    # groups made locally (use_local_synchronization=True) take no name from the count
    t = ranks_trace(0, [((0, 1), True, 7)])
    local = replace(t, notes=tuple({**n, "local": True} for n in t.notes))
    assert [c.takes_a_name for c in group_calls(local, WORLD)] == [False]


def _thread(*frames):
    return ThreadStack(1, "MainThread", tuple(Location(p, ln, fn) for p, ln, fn in frames),
                       True, True, True)


TORCH = "/venv/lib/python3.11/site-packages/torch"


def test_places_read_from_stacks():
    store = _thread((f"{TORCH}/distributed/elastic/utils/store.py", 80, "synchronize"),
                    (f"{TORCH}/distributed/elastic/utils/store.py", 120, "barrier"),
                    ("/job/train.py", 12, "main"))
    assert thread_place(store).kind is PlaceKind.STORE
    rendezvous = _thread((f"{TORCH}/distributed/rendezvous.py", 200, "_create_c10d_store"),
                         (f"{TORCH}/distributed/distributed_c10d.py", 1500,
                          "init_process_group"), ("/job/train.py", 5, "main"))
    place = thread_place(rendezvous)
    assert place.kind is PlaceKind.RENDEZVOUS and place.function == "init_process_group"
    assert place.frame is not None and place.frame.line == 5
    loader = _thread(("/usr/lib/python3.11/multiprocessing/queues.py", 113, "Queue.get"),
                     (f"{TORCH}/utils/data/dataloader.py", 1291,
                      "_MultiProcessingDataLoaderIter._try_get_data"),
                     ("/job/train.py", 30, "main"))
    assert thread_place(loader).kind is PlaceKind.DATALOADER
    mine = _thread(("/usr/lib/python3.11/threading.py", 320, "Event.wait"),
                   ("/job/train.py", 40, "main"))
    assert thread_place(mine).kind is PlaceKind.OUTSIDE
    assert not PlaceKind.OUTSIDE.blocked_in_torch and PlaceKind.STORE.blocked_in_torch


def test_a_group_mismatch_with_ranks_still_inside_is_a_hang_without_the_watchdog():
    """Replayed with no watchdog record (run --no-watch, or a capture copied mid-run), ranks
    still inside new_group for a group their peers never make are hung, not crashed."""
    from nccl_doctor.analysis import analyze
    from nccl_doctor.diagnosis import Verdict

    traces = make_traceset([
        ranks_trace(0, [((0, 1), True, 7), ((0, 2), False, 8)]),
        ranks_trace(1, [((0, 1), True, 7), ((0, 2), True, 8)], ended=True),
        ranks_trace(2, [((0, 2), False, 8)]),
        ranks_trace(3, [((0, 2), True, 8)], ended=True),
    ])
    d = analyze(traces, annotators=())
    assert d.root_cause is not None and d.root_cause.kind is FindingKind.GROUP_MISMATCH
    assert d.verdict is Verdict.HANG, d.verdict


def test_notes_of_the_wrong_types_are_read_as_unknown_not_a_failed_pass():
    t = ranks_trace(0, [((0, 1), True, 7)])
    odd = replace(t, notes=tuple({**n, "time_ns": "x", "count": "y", "ranks": "z", "idx": None}
                                 for n in t.notes))
    (call,) = group_calls(odd, WORLD)
    assert (call.asked, call.name, call.time_ns, call.event) == ((0, 1, 2, 3), "", 0, None)


def test_groups_a_rank_never_made_though_nothing_waited_are_a_warning():
    """NCCL makes a group's communicator at its first collective: a mesh made by every rank
    but one, never used, hangs nothing - yet every later group is named differently there."""
    made = [((0, 2), True, 6), ((1, 3), True, 6)]
    traces = make_traceset([ranks_trace(r, [] if r == 1 else made, ended=True)
                            for r in range(WORLD)])
    (f,) = detect_group_mismatch(traces)
    assert f.severity.value == "warning" and f.ranks == (1,)
    assert f.title.startswith("rank 1 never made process group [0, 2] (and 1 more after it)")
    # a rank that failed before it made them says nothing about them: its failure is the news
    failed = make_traceset([ranks_trace(r, made, ended=True) for r in (0, 2, 3)]
                           + [replace(ranks_trace(1, [], ended=True),
                                      exit=raised(time_ns=T0))])
    assert detect_group_mismatch(failed) == []
