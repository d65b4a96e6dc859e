"""Builders for synthetic traces (frozen model dataclasses, no capture files, no torch).

Test modules reach them through the ``tb`` fixture (``tb.event``, ``tb.trace``, ...) rather than
``import conftest``: tests/integration has a conftest of its own, and the module name would clash.
The ``scenario`` fixture yields the named scenarios of ``SCENARIOS`` (used by the reporter tests).
"""

from __future__ import annotations

import errno
import os
from types import SimpleNamespace
from typing import Callable

import pytest
from pathlib import Path

from nccl_doctor.model import (
    Location, Event, EventFlag, EventKind, EventState, ExitKind, GroupInfo, Integrity, RankExit,
    RankMeta, RankTrace, TraceSet,
)

RETURNED = EventState.RETURNED
ENTERED = EventState.ENTERED
FAILED = EventState.FAILED

T0 = 1_700_000_000_000_000_000  # a plausible time_ns origin
STEP = 1_000_000  # 1 ms between consecutive calls of a rank


def make_event(
    idx: int,
    op: str = "all_reduce",
    group: str = "0",
    seq: int | None = None,
    input: str = "float32[4]",
    state: EventState = EventState.RETURNED,
    *,
    kind: EventKind = EventKind.COLLECTIVE,
    output: str = "",
    peer: int = -1,
    group_size: int = 2,
    seq_offset: int = 0,
    seq_delta: int | None | str = "auto",
    parent: int = 0,
    flags: EventFlag = EventFlag.NONE,
    t_enter_ns: int | None = None,
    callsite: Location | None = None,
    line: int | None = None,
) -> Event:
    """One recorded call. ``idx`` is rank-local; ``seq`` defaults to ``idx + seq_offset``."""
    if seq is None:
        seq = idx + seq_offset
    if seq_delta == "auto":
        seq_delta = None if state is EventState.ENTERED else 1
    t_enter = T0 + idx * STEP if t_enter_ns is None else t_enter_ns
    if callsite is None:
        callsite = Location("/job/train.py", line if line is not None else 100 + idx, "step")
    return Event(
        idx=idx, parent=parent, kind=kind, op=op, group=group, seq=seq, seq_offset=seq_offset,
        seq_delta=seq_delta, state=state, flags=flags, t_enter_ns=t_enter,
        t_exit_ns=None if state is EventState.ENTERED else t_enter + STEP // 2, thread=1,
        input=input, output=output, nbytes=16, peer=peer, group_size=group_size,
        callsite=callsite, api_callsite=callsite,
    )


def collectives(
    n: int,
    op: str = "all_reduce",
    group: str = "0",
    input: str = "float32[4]",
    last_state: EventState = EventState.RETURNED,
    *,
    group_size: int = 2,
    start: int = 1,
) -> list[Event]:
    """``n`` identical collectives numbered ``start..start+n-1`` (idx == seq); the last one ends
    in ``last_state``."""
    return [
        make_event(
            i, op, group, input=input, group_size=group_size,
            state=last_state if i == start + n - 1 else EventState.RETURNED,
        )
        for i in range(start, start + n)
    ]


def clean(time_ns: int | None = None, code: int = 0) -> RankExit:
    return RankExit(ExitKind.CLEAN, code=code, time_ns=time_ns)


def raised(
    message: str = "RuntimeError: Connection closed by peer",
    callsite: Location | None = None,
    time_ns: int | None = None,
) -> RankExit:
    return RankExit(ExitKind.EXCEPTION, code=1, exception=message, callsite=callsite,
                    time_ns=time_ns)


RUNNING = RankExit(ExitKind.RUNNING)


def make_trace(
    rank: int,
    events: list[Event] | tuple[Event, ...] = (),
    exit: RankExit | None = None,
    *,
    world_size: int = 2,
    host: str | None = None,
    integrity: Integrity | None = None,
) -> RankTrace:
    meta = RankMeta(
        rank=rank, world_size=world_size, local_rank=rank, node_rank=0,
        host=host if host is not None else "node0", pid=1000 + rank,
        started_ns=T0 - 10 * STEP,
    )
    return RankTrace(
        meta=meta, events=tuple(events), exit=exit if exit is not None else RUNNING,
        integrity=integrity or Integrity(), path=f"/caps/rank{rank:05d}.node0.{1000 + rank}.ndcap",
    )


def make_traceset(
    traces: list[RankTrace],
    groups: dict[str, tuple[int, ...]] | None = None,
    *,
    world_size: int | None = None,
    exit_status: int | None = None,
    problems: tuple[str, ...] = (),
) -> TraceSet:
    by_rank = {t.rank: t for t in traces}
    if groups is None:
        groups = {"0": tuple(sorted(by_rank))} if by_rank else {}
    if world_size is None:
        world_size = max((t.meta.world_size for t in traces), default=0)
    return TraceSet(
        ranks=by_rank,
        groups={name: GroupInfo(name, tuple(ranks), "gloo") for name, ranks in groups.items()},
        world_size=world_size, command=("torchrun", "train.py"), exit_status=exit_status,
        problems=problems, source="/caps",
    )


# -- named scenarios (shared by the detector and reporter tests) ---------------------------------

def scenario_clean() -> TraceSet:
    """Two ranks, five matching all_reduces, both exit cleanly."""
    return make_traceset([
        make_trace(r, collectives(5), clean(T0 + 100 * STEP)) for r in (0, 1)
    ])


def scenario_shape_mismatch() -> TraceSet:
    """The padded all_gather: each rank pads to its own length; gloo raises on both ranks."""
    traces = []
    for rank, length in ((0, 7), (1, 9)):
        events = collectives(2) + [
            make_event(3, "all_gather", input=f"float32[2,{length},32]", state=FAILED,
                       seq_delta=1, line=40),
        ]
        traces.append(make_trace(
            rank, events,
            raised("RuntimeError: [../gloo/transport/tcp/pair.cc:534] Connection closed by peer",
                   Location("/job/train.py", 40, "step"), T0 + 50 * STEP),
        ))
    return make_traceset(traces)


def scenario_rank_exited_early() -> TraceSet:
    """4 ranks: rank 1 ran out of data after collective #4 and exited cleanly; the others entered
    #5, waited, then raised (gloo's timeout)."""
    traces = []
    for rank in (0, 2, 3):
        traces.append(make_trace(
            rank, collectives(5, group_size=4, last_state=FAILED),
            raised("RuntimeError: [/gloo/pair.cc:1] Timed out waiting 1800000ms for recv",
                   Location("/job/train.py", 105, "step"), T0 + 900 * STEP),
            world_size=4,
        ))
    traces.append(make_trace(1, collectives(4, group_size=4), clean(T0 + 6 * STEP), world_size=4))
    return make_traceset(traces)


def scenario_hang_missing() -> TraceSet:
    """3 ranks: ranks 0 and 2 are stuck in all_reduce #4; rank 1 is blocked in a barrier of
    another group. Nobody exited."""
    blocked = make_event(4, "barrier", group="1", seq=1, input="", state=ENTERED,
                         group_size=1)
    return make_traceset(
        [
            make_trace(0, collectives(4, group_size=3, last_state=ENTERED), RUNNING,
                       world_size=3),
            make_trace(1, collectives(3, group_size=3) + [blocked], RUNNING, world_size=3),
            make_trace(2, collectives(4, group_size=3, last_state=ENTERED), RUNNING,
                       world_size=3),
        ],
        groups={"0": (0, 1, 2)},
    )


def scenario_no_capture() -> TraceSet:
    """World of 3; rank 2 never reached init_process_group (no capture at all)."""
    return make_traceset(
        [make_trace(r, collectives(2, group_size=3, last_state=ENTERED), RUNNING, world_size=3)
         for r in (0, 1)],
        groups={"0": (0, 1, 2)}, world_size=3,
    )


def scenario_empty() -> TraceSet:
    return make_traceset([], world_size=0)


SCENARIOS: dict[str, Callable[[], TraceSet]] = {
    "empty": scenario_empty,
    "clean": scenario_clean,
    "shape_mismatch": scenario_shape_mismatch,
    "rank_exited_early": scenario_rank_exited_early,
    "hang_missing": scenario_hang_missing,
    "no_capture": scenario_no_capture,
}


@pytest.fixture
def full_disk(monkeypatch: pytest.MonkeyPatch) -> None:
    """posix_fallocate says there is no room, as on a full disk (which cannot be made here)."""
    def no_room(fd: int, offset: int, length: int) -> None:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(os, "posix_fallocate", no_room)


@pytest.fixture
def tb() -> SimpleNamespace:
    """The trace builders."""
    return SimpleNamespace(
        event=make_event, collectives=collectives, trace=make_trace, traceset=make_traceset,
        clean=clean, raised=raised, RUNNING=RUNNING, T0=T0, STEP=STEP, scenarios=SCENARIOS,
        ENTERED=ENTERED, RETURNED=RETURNED,
    )


@pytest.fixture(params=sorted(SCENARIOS))
def scenario(request: pytest.FixtureRequest) -> tuple[str, TraceSet]:
    return request.param, SCENARIOS[request.param]()


class _Site(type(Path())):  # a directory on sys.path where distributions are "installed"
    def install(self, dist: str, entry: str, module: str, source: str) -> None:
        """A distribution as pip would leave it: its module and a dist-info registering
        ``entry`` in the ``nccl_doctor.known_issues`` entry-point group."""
        (self / f"{module}.py").write_text(source)
        info = self / f"{dist}-1.0.dist-info"
        info.mkdir()
        (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {dist}\nVersion: 1.0\n")
        (info / "entry_points.txt").write_text(f"[nccl_doctor.known_issues]\n{entry}\n")


@pytest.fixture
def site(tmp_path, monkeypatch):
    """A fresh site directory on sys.path (``site.install(...)`` a plugin's distribution),
    the entry points read again around the test."""
    from nccl_doctor import entry_points

    monkeypatch.syspath_prepend(str(tmp_path))
    entry_points.load.cache_clear()
    yield _Site(tmp_path)
    entry_points.load.cache_clear()
