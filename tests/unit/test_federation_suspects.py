"""Which ranks' full summaries the leader of a quiet job of many nodes asks for: those whose
digests part from their group (federation/suspects.py)."""

from __future__ import annotations

from nccl_doctor.supervisor.federation.suspects import odd_ranks


def _waiting(tb, rank, seq, op="all_reduce", group="0", exit=None, state=None):
    events = tb.collectives(seq - 1, group_size=4) + [
        tb.event(seq, op, group=group, state=state or tb.ENTERED, group_size=4)]
    return tb.trace(rank, events, exit or tb.RUNNING, world_size=4)


def test_the_ranks_that_part_from_their_group_are_suspect(tb):
    alike = [_waiting(tb, r, 9) for r in range(3)]
    assert odd_ranks(alike) == set()  # every rank waits in the same call: nothing parts
    assert odd_ranks(alike + [_waiting(tb, 3, 9, op="broadcast")]) == {3}  # a mismatch
    assert odd_ranks(alike + [_waiting(tb, 3, 8)]) == {3}  # behind: it never arrived
    computing = tb.trace(3, tb.collectives(8, group_size=4), tb.RUNNING, world_size=4)
    assert odd_ranks(alike + [computing]) == {3}  # in no call while its peers wait
    ended = _waiting(tb, 3, 9, exit=tb.raised("RuntimeError: x", None, tb.T0))
    assert odd_ranks(alike + [ended]) == {3}
