"""The replay window of large jobs (capture/window.py): the passes shown only the records around
each group's first divergence, its slowest member's last call and each rank's newest records
must say what they say on every record. Each job here is replayed twice - every record, and a
window forced with a tail far shorter than the job - and the reports compared."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from nccl_doctor.analysis import analyze
from nccl_doctor.analysis.calls.ends import Ending, with_ends_known
from nccl_doctor.capture import format as fmt
from nccl_doctor.capture.live_captures import LiveCaptures
from nccl_doctor.capture.window import Size
from nccl_doctor.analysis.calls.loaded import load_capture_dir
from nccl_doctor.capture.manifest import Manifest
from nccl_doctor.capture.writer import CaptureWriter
from nccl_doctor.model import EventKind, EventState, Unrecorded

T0 = 1_700_000_000_000_000_000
WORLD = 8
HALVES = {"1": [0, 1, 2, 3], "2": [4, 5, 6, 7]}


def schedule(calls: int) -> list[tuple[str, str, str]]:
    """(group, op, tensor) per call: world all_reduce, a half's all_gather, world broadcast."""
    out = []
    for i in range(calls):
        out.append(("0", "all_reduce", "float32[64]") if i % 3 == 0 else
                   ("half", "all_gather", "bfloat16[8,16]") if i % 3 == 1 else
                   ("0", "broadcast", "int64[2]"))
    return out


def write_job(root: Path, calls: int, *, change=None, stop_at: dict[int, int] | None = None,
              exits: dict[int, int] | None = None) -> Path:
    """Every rank runs ``schedule(calls)``; ``change(rank, i, call) -> call | None`` alters or
    skips a call; a rank in ``stop_at`` hangs in its call #i (left entered); one in ``exits``
    exits cleanly after #i calls."""
    out = root / "capture"
    out.mkdir()
    stop_at, exits = stop_at or {}, exits or {}
    for rank in range(WORLD):
        w = CaptureWriter(out / f"rank{rank:05d}.node0.{100 + rank}{fmt.CAPTURE_SUFFIX}",
                          {"rank": rank, "world_size": WORLD, "host": "node0", "pid": 100 + rank,
                           "started_ns": T0})
        half = "1" if rank < 4 else "2"
        w.note("group", name="0", ranks=list(range(WORLD)), backend="gloo")
        w.note("group", name=half, ranks=HALVES[half], backend="gloo")
        seqs: dict[str, int] = {}
        site = w.intern("/job/train.py")
        last = min(stop_at.get(rank, calls), exits.get(rank, calls))
        for i, call in enumerate(schedule(calls)[:last + (1 if rank in stop_at else 0)]):
            if change is not None:
                call = change(rank, i, call)
                if call is None:
                    continue
            group, op, tensor = call
            group = half if group == "half" else group
            seqs[group] = seqs.get(group, 0) + 1
            size = WORLD if group == "0" else 4
            idx = w.begin((0, T0 + i * 1_000_000 + rank * 1000, seqs[group], 256, 1,
                           w.intern(op), w.intern(group), w.intern(tensor), 0, site, 100 + i % 7,
                           w.intern("step"), site, 100 + i % 7, 0,
                           0 if op == "broadcast" else -1, size, 0,
                           int(EventKind.COLLECTIVE), 0, 0))
            if not (rank in stop_at and i == stop_at[rank]):
                w.end(idx, int(EventState.RETURNED), 1)
        if rank in exits:
            w.note("exit")
    Manifest(command=("python", "train.py"), started_at=0.0, run_id="w", world_size=WORLD,
             ended_at=1.0, exit_status=0 if len(exits) == WORLD else 1).write(out)
    return out


def reports(out: Path) -> tuple[dict, dict]:
    full = analyze(load_capture_dir(out)).to_json()
    cut = analyze(load_capture_dir(out, window=Size(above=0, tails=0, tail=6))).to_json()
    return full, cut


def same(full: dict, cut: dict) -> None:
    note = cut["notes"][-1]
    assert "records compared across the ranks" in note
    kept, total = int(note.split("; ")[1].split()[0]), int(note.split()[0])
    assert kept < total / 3  # the window really left most records out
    cut = {**cut, "notes": cut["notes"][:-1]}
    assert json.dumps(full, sort_keys=True) == json.dumps(cut, sort_keys=True)


def _shape(rank, i, call):
    return (call[0], call[1], "float32[65]") if rank == 5 and i == 150 else call


def _skip(rank, i, call):
    return None if rank == 3 and i == 200 else call


def _op(rank, i, call):
    return (call[0], "reduce", call[2]) if rank == 6 and i == 90 else call


@pytest.mark.parametrize("change, stop, exits, kind", [
    (_shape, {r: 299 for r in range(WORLD)}, None, "collective_mismatch"),
    (_skip, {r: 299 if r != 3 else 298 for r in range(WORLD)}, None, "collective_mismatch"),
    (_op, {r: 299 for r in range(WORLD)}, None, "collective_mismatch"),
    (None, {r: 120 for r in range(WORLD) if r != 6}, {6: 120}, "missing_collective"),
    (None, {r: 299 for r in range(WORLD) if r != 2}, {2: 40}, "missing_collective"),
])
def test_the_window_gives_the_report_every_record_gives(tmp_path, change, stop,
                                                         exits, kind):
    out = write_job(tmp_path, 300, change=change, stop_at=stop, exits=exits)
    full, cut = reports(out)
    assert kind in {f["kind"] for f in full["findings"]}
    same(full, cut)


def test_a_healthy_job_stays_healthy_in_the_window(tmp_path):
    out = write_job(tmp_path, 300, exits={r: 300 for r in range(WORLD)})
    full, cut = reports(out)
    assert full["verdict"] == "ok"
    same(full, cut)


def test_small_replays_are_not_windowed(tmp_path):
    out = write_job(tmp_path, 30, change=_skip)
    traces = load_capture_dir(out)
    assert not any("records compared" in p for p in traces.problems)
    assert sum(len(t.events) for t in traces.ranks.values()) == 30 * WORLD


def test_a_running_job_past_the_window_is_looked_at_through_each_ranks_newest_records(
        tmp_path):
    out = write_job(tmp_path, 300, stop_at={r: 299 for r in range(WORLD)})
    live = LiveCaptures(out, window=Size(above=1000, tails=400))
    traces = live.load()
    assert live.load() is traces  # nothing new: the same object, analysed once
    for rank, trace in traces.ranks.items():
        assert len(trace.events) == 64 and trace.records == 300  # TAIL: 400 // 8 is less
        assert trace.events[-1].state is EventState.ENTERED  # where it stands now
    live.close()


def test_a_rank_unrecorded_after_the_first_look_is_seen_at_the_next(tmp_path):
    """The live looks hand back the same TraceSet while no capture moved; a marker of a rank
    that could not make its capture (capture/unrecorded.py) is news all the same."""
    from nccl_doctor.capture.unrecorded import write_unrecorded
    out = write_job(tmp_path, 30, stop_at={r: 29 for r in range(WORLD)})
    live = LiveCaptures(out)
    first = live.load()
    assert live.load() is first and first.unrecorded == {}
    write_unrecorded(out, "rank00008.h.1", 8, WORLD + 1, "h", "cannot create its capture")
    now = live.load()
    assert now is not first and now.unrecorded == {8: Unrecorded("cannot create its capture", "h")}
    assert now.world_size == WORLD + 1 and live.load() is now
    live.close()


@pytest.mark.parametrize("change, stop, exits", [
    (_shape, {r: 299 for r in range(WORLD)}, None),
    (None, {r: 120 for r in range(WORLD) if r != 6}, {6: 120}),
])
def test_the_supervisors_post_mortem_sees_what_a_replay_sees(tmp_path, change, stop, exits):
    """The supervisor's post mortem (LiveCaptures.final: the followers' held records, a large
    job's window picked on their columns, nothing decoded again) is the replay's job: the same
    records, the same report - on every record and in a forced window."""
    out = write_job(tmp_path, 300, change=change, stop_at=stop, exits=exits)
    for size in (Size(), Size(above=0, tails=0, tail=6)):
        live = LiveCaptures(out, window=size)
        live.load()  # followed while the job ran: the post mortem reads only what came since
        held = live.final()
        assert live.final() is held
        replay = load_capture_dir(out, window=size, evidence=False, job_ended=True)
        assert {r: [e.idx for e in t.events] for r, t in held.ranks.items()} == \
            {r: [e.idx for e in t.events] for r, t in replay.ranks.items()}
        mine = analyze(with_ends_known(held, Ending(ended=True))).to_json()
        theirs = analyze(replay).to_json()
        assert json.dumps(mine, sort_keys=True) == json.dumps(theirs, sort_keys=True)
        live.close()
