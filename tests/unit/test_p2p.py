"""Point-to-point as its own model (analysis/calls/p2p_channels.py, analysis/what/p2p.py), on
synthetic traces shaped as the recorder writes them: ``send`` records itself around the ``isend`` and the
``wait`` it makes; ``batch_isend_irecv`` is a composite record around its ops, waited through
it; ``isend``/``irecv`` return their Work (ISSUED) and are waited later."""

from __future__ import annotations

from dataclasses import replace

import pytest

from nccl_doctor.analysis import analyze
from nccl_doctor.analysis.what.p2p import detect_p2p_mismatch
from nccl_doctor.analysis.calls.p2p_channels import p2p_channels
from nccl_doctor.analysis.calls.situation import Situation, assess
from nccl_doctor.diagnosis import FindingKind, Severity, Verdict
from nccl_doctor.model import EventFlag, EventKind, EventState, ExitKind, RankExit

P2P, WAIT = EventKind.P2P, EventKind.WAIT
ISSUED, ENTERED, RETURNED, FAILED = (EventState.ISSUED, EventState.ENTERED, EventState.RETURNED,
                                     EventState.FAILED)
STOPPED = RankExit(ExitKind.STOPPED, signal="exit request")


class Rank:
    """One rank's records, appended as the recorder writes them."""

    def __init__(self, tb, rank: int) -> None:
        self.tb, self.rank, self.events, self.collectives = tb, rank, [], 0

    def _add(self, op, kind=P2P, state=RETURNED, **kw):
        ev = self.tb.event(len(self.events) + 1, op, kind=kind, state=state, **kw)
        self.events.append(ev)
        return ev.idx

    def blocking(self, op: str, peer: int, done: bool = True, shape: str = "float32[2,4]",
                 line: int = 10) -> None:
        """``send``/``recv``: itself, the ``isend``/``irecv`` it makes, and its wait."""
        outer = self._add(op, state=RETURNED if done else ENTERED, peer=peer, input=shape,
                          line=line)
        inner = self._add("i" + op, state=ISSUED, peer=peer, input=shape, parent=outer,
                          flags=EventFlag.ASYNC, line=line)
        self._add("wait", kind=WAIT, state=RETURNED if done else ENTERED, parent=inner,
                  input=shape, line=line)

    def issue(self, op: str, peer: int, shape: str = "float32[2,4]") -> int:
        return self._add(op, state=ISSUED, peer=peer, input=shape, flags=EventFlag.ASYNC)

    def wait(self, parent: int, state: EventState = RETURNED) -> None:
        self._add("wait", kind=WAIT, state=state, parent=parent)

    def batch(self, ops: list[tuple[str, int]], waits: list[EventState]) -> None:
        outer = self._add("batch_isend_irecv", state=ISSUED, input="2*object",
                          flags=EventFlag.ASYNC | EventFlag.COMPOSITE)
        for op, peer in ops:
            self._add(op, state=ISSUED, peer=peer, parent=outer, flags=EventFlag.ASYNC)
        for state in waits:
            self._add("wait", kind=WAIT, state=state, parent=outer)

    def barrier(self, state: EventState = RETURNED) -> None:
        self.collectives += 1  # (numbered among the group's collectives, as align_seq is)
        self._add("barrier", kind=EventKind.COLLECTIVE, state=state, input="",
                  seq=self.collectives)

    def trace(self, exit=None):
        return self.tb.trace(self.rank, self.events, exit)


def pipeline(tb, sent: list[int], expected: list[int], exit=None):
    """The hand-written two-stage pipeline: per step, rank 0 sends ``sent[i]`` messages, rank 1
    receives ``expected[i]``, then both enter a barrier. The last step's short end goes on to
    its barrier; the long end waits in its unpaired call."""
    r0, r1 = Rank(tb, 0), Rank(tb, 1)
    steps = len(sent)
    for i, (n_sent, n_recv) in enumerate(zip(sent, expected)):
        last = i == steps - 1
        for k in range(n_sent):
            r0.blocking("send", 1, done=not (last and n_sent > n_recv and k == n_sent - 1),
                        line=10)
        for k in range(n_recv):
            r1.blocking("recv", 0, done=not (last and n_recv > n_sent and k == n_recv - 1),
                        line=20)
        short = n_sent != n_recv and last
        if not short or n_sent < n_recv:
            r0.barrier(ENTERED if short else RETURNED)
        if not short or n_recv < n_sent:
            r1.barrier(ENTERED if short else RETURNED)
    return tb.traceset([r0.trace(exit), r1.trace(exit)])


def test_no_p2p_or_no_ranks_says_nothing(tb):
    assert detect_p2p_mismatch(tb.traceset([])) == []
    assert detect_p2p_mismatch(tb.scenarios["hang_missing"]()) == []


def test_a_message_is_the_leaf_call_and_channels_pair_in_order(tb):
    traces = pipeline(tb, [4, 4], [4, 4])
    channels = p2p_channels(traces).channels
    assert list(channels) == [("0", 0, 1)]
    ch = channels[("0", 0, 1)]
    # (the send around each isend is not a message of its own)
    assert [e.op for e in ch.sends] == ["isend"] * 8 and [e.op for e in ch.recvs] == ["irecv"] * 8
    assert not ch.short
    assert detect_p2p_mismatch(traces) == []


def test_a_short_channel_says_which_and_by_how_much(tb):
    traces = pipeline(tb, [4, 3], [4, 4], exit=STOPPED)
    (f,) = detect_p2p_mismatch(traces)
    assert f.kind is FindingKind.P2P_MISMATCH and f.severity is Severity.ERROR
    ev = f.evidence
    assert (ev.aspect, ev.src, ev.dst, ev.sent, ev.received) == ("count", 0, 1, 7, 8)
    assert ev.step == {"after": "barrier #1 (group 0)", "sent": 3, "received": 4}
    assert dict(ev.waiting) == {1: "waits"}
    assert "rank 0 sent 3 messages since barrier #1 (group 0), rank 1 waits for a 4th" in f.title
    assert "rank 0 is blocked in barrier #2 (group 0)" in ev.instead[0]
    assert f.branch is None


def test_the_sender_that_waits_for_a_receive_is_short_too(tb):
    """NCCL's send waits for its receive: rank 0 sends a 4th nobody receives."""
    (f,) = detect_p2p_mismatch(pipeline(tb, [4, 4], [4, 3], exit=STOPPED))
    assert (f.evidence.sent, f.evidence.received) == (8, 7)
    assert dict(f.evidence.waiting) == {0: "waits"}
    assert "rank 1 received 3 messages since barrier #1 (group 0), rank 0 waits to send a 4th" \
        in f.title


def test_the_short_channel_is_the_root_cause_not_the_barrier_the_stage_split_left(tb):
    """The barrier rank 0 entered and rank 1 never did is the channel's consequence: rank 1
    waits in a receive. No branch is named (the stage split is the design)."""
    d = analyze(pipeline(tb, [4, 3], [4, 4], exit=STOPPED), annotators=())
    assert d.verdict is Verdict.HANG
    assert d.root_cause is not None and d.root_cause.kind is FindingKind.P2P_MISMATCH
    assert not [f for f in d.findings if f.kind is FindingKind.MISSING_COLLECTIVE]
    assert all(f.branch is None for f in d.findings)


def test_a_rank_still_computing_may_yet_send(tb):
    """A live look: rank 1 waits for a 4th while rank 0 computes (no call pending): behind, not
    short. Once rank 0 is blocked in the barrier, it can send no more."""
    traces = pipeline(tb, [4, 3], [4, 4])  # (both running)
    r0 = traces.ranks[0]
    computing = replace(r0, events=r0.events[:-1])  # (before its barrier)
    assert detect_p2p_mismatch(replace(traces, ranks={**traces.ranks, 0: computing})) == []
    assert len(detect_p2p_mismatch(traces)) == 1


def test_the_watchdog_calls_a_short_channel_a_deadlock(tb):
    traces = pipeline(tb, [4, 3], [4, 4])  # every live rank blocked
    a = assess(traces, analyze(traces, annotators=()), {})
    assert a.situation is Situation.DEADLOCK
    assert a.cause is not None and a.cause.kind is FindingKind.P2P_MISMATCH


def test_async_receives_waited_later_pair_and_block_where_their_wait_is(tb):
    """1F1B-style: irecvs issued up front, each waited later. A receive whose send was made is
    in flight (it completes); the one with no send is where the rank blocks."""
    r0, r1 = Rank(tb, 0), Rank(tb, 1)
    ids = [r1.issue("irecv", 0) for _ in range(3)]
    for _ in range(3):
        r0.wait(r0.issue("isend", 1))
    r0.barrier(ENTERED)
    r1.wait(ids[0])
    r1.wait(ids[1], ENTERED)  # its send was made: in flight
    traces = tb.traceset([r0.trace(), r1.trace()])
    assert detect_p2p_mismatch(traces) == []
    r1.events[-1] = replace(r1.events[-1], state=RETURNED)
    r1.wait(ids[2])
    extra = r1.issue("irecv", 0)
    r1.wait(extra, ENTERED)  # a 4th, never sent
    (f,) = detect_p2p_mismatch(tb.traceset([r0.trace(), r1.trace()]))
    assert (f.evidence.sent, f.evidence.received) == (3, 4)
    assert dict(f.evidence.waiting) == {1: "waits"}


def test_a_batch_is_waited_through_its_record(tb):
    r0, r1 = Rank(tb, 0), Rank(tb, 1)
    r0.batch([("isend", 1)] * 3, [RETURNED] * 3)
    r0.barrier(ENTERED)
    r1.batch([("irecv", 0)] * 4, [RETURNED] * 3 + [ENTERED])
    (f,) = detect_p2p_mismatch(tb.traceset([r0.trace(), r1.trace()]))
    assert (f.evidence.sent, f.evidence.received) == (3, 4)
    assert dict(f.evidence.waiting) == {1: "waits"}


def test_both_ranks_receiving_first_is_one_deadlock(tb):
    r0, r1 = Rank(tb, 0), Rank(tb, 1)
    r0.blocking("recv", 1, done=False)
    r1.blocking("recv", 0, done=False)
    (f,) = detect_p2p_mismatch(tb.traceset([r0.trace(), r1.trace()]))
    assert f.evidence.aspect == "deadlock" and f.evidence.cycle == (0, 1)
    assert f.ranks == (0, 1) and "neither sent" in f.title


def test_receives_that_failed_by_timeout_are_still_the_deadlock(tb):
    r0, r1 = Rank(tb, 0), Rank(tb, 1)
    for r, peer in ((r0, 1), (r1, 0)):
        r.blocking("recv", peer, done=False)
        r.events[0] = replace(r.events[0], state=FAILED)
        r.events[2] = replace(r.events[2], state=FAILED)
    raised = tb.raised("RuntimeError: Timed out waiting 60000ms for recv operation")
    (f,) = detect_p2p_mismatch(tb.traceset([r0.trace(raised), r1.trace(raised)]))
    assert f.evidence.aspect == "deadlock"
    assert dict(f.evidence.waiting) == {0: "waits", 1: "waits"}


@pytest.mark.parametrize("ended, severity", [(True, Severity.WARNING), (False, Severity.ERROR)])
def test_a_receive_of_another_shape_is_named(tb, ended, severity):
    """A job that ended well received wrong bytes silently (a warning); one that hangs or
    failed, an error."""
    r0, r1 = Rank(tb, 0), Rank(tb, 1)
    r0.blocking("send", 1)
    r0.blocking("send", 1, shape="float32[2,6]")
    r1.blocking("recv", 0)
    r1.blocking("recv", 0, shape="float32[2,8]")
    exit = tb.clean() if ended else None
    (f,) = detect_p2p_mismatch(tb.traceset([r0.trace(exit), r1.trace(exit)]))
    ev = f.evidence
    assert (ev.aspect, ev.message, ev.differing) == ("shape", 2, 1)
    assert (ev.sent_input, ev.received_input) == ("float32[2,6]", "float32[2,8]")
    assert f.severity is severity
    assert "message #2 sent as float32[2,6], received into float32[2,8]" in f.title


def test_a_dtype_is_told_from_a_shape(tb):
    r0, r1 = Rank(tb, 0), Rank(tb, 1)
    r0.blocking("send", 1)
    r1.blocking("recv", 0, shape="float64[2,4]")
    (f,) = detect_p2p_mismatch(tb.traceset([r0.trace(tb.clean()), r1.trace(tb.clean())]))
    assert f.evidence.aspect == "dtype"


def test_a_window_or_a_lapped_ring_cuts_a_channel_so_it_is_not_counted(tb):
    """A large job's window (capture/window.py) or a ring that overwrote its oldest records
    holds part of a channel's history: no count is said from it."""
    traces = pipeline(tb, [4, 3], [4, 4], exit=STOPPED)
    assert len(detect_p2p_mismatch(traces)) == 1
    r1 = traces.ranks[1]
    for cut in (replace(r1, recorded=len(r1.events) + 12),
                replace(r1, integrity=replace(r1.integrity, overwritten=12))):
        assert detect_p2p_mismatch(replace(traces, ranks={**traces.ranks, 1: cut})) == []


def test_a_window_that_kept_every_message_counts_its_channels(tb):
    """The supervisor's look at a long run (its newest records, with every message before them,
    the waits on them and their parents) counts a channel as the whole capture does."""
    from nccl_doctor.capture.live_captures import _newest

    traces = pipeline(tb, [4, 4, 4, 3], [4, 4, 4, 4], exit=STOPPED)
    (whole,) = detect_p2p_mismatch(traces)
    cut = {r: replace(t, events=_newest(t.events, 6)[0], recorded=len(t.events),
                      p2p_whole=True)
           for r, t in traces.ranks.items()}
    assert all(len(t.events) < len(traces.ranks[r].events) for r, t in cut.items())
    (f,) = detect_p2p_mismatch(replace(traces, ranks=cut))
    ev, was = f.evidence, whole.evidence
    assert (ev.aspect, ev.src, ev.dst, ev.sent, ev.received, dict(ev.waiting)) == (
        was.aspect, was.src, was.dst, was.sent, was.received, dict(was.waiting))
    # (the barrier the step is counted from is older than the look: the whole channel is said)
    assert "rank 0 sent 15 messages, rank 1 waits for a 16th" in f.title, f.title


def test_a_replay_of_a_run_whose_end_is_unknown_calls_no_channel_short(tb):
    traces = pipeline(tb, [4, 3], [4, 4])
    assert detect_p2p_mismatch(replace(traces, unfinished="the job was still running")) == []


def test_a_receive_from_any_source_leaves_its_channels_out(tb):
    r0, r1 = Rank(tb, 0), Rank(tb, 1)
    r0.blocking("send", 1)
    r0.barrier(ENTERED)
    r1.blocking("recv", 0)
    r1.blocking("recv", -1, done=False)  # recv(src=None)
    traces = tb.traceset([r0.trace(), r1.trace()])
    assert ("0", 0, 1) not in p2p_channels(traces).channels  # left out, not counted short
    assert detect_p2p_mismatch(traces) == []


def test_past_its_bound_a_look_keeps_no_whole_channel(tb, monkeypatch):
    """More messages than ``window.P2P_WHOLE`` before the look's newest records: they are not
    all kept, and the channel is not counted (memory stays bounded)."""
    from nccl_doctor.capture import live_captures

    traces = pipeline(tb, [4, 4, 4, 3], [4, 4, 4, 4], exit=STOPPED)
    monkeypatch.setattr(live_captures, "P2P_WHOLE", 5)
    events, whole = live_captures._newest(traces.ranks[0].events, 6)
    assert not whole and len(events) == 6
    assert live_captures._newest(traces.ranks[0].events, 400) == (traces.ranks[0].events, True)
