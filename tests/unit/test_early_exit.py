"""Ranks that raise before they join a process group: the record a rank leaves
(rank/early_exit.py, capture/early_exit.py), read back by the loaders, and what the analysis says
of it (analysis/what/exited.py ``raised_before_joining``)."""

from __future__ import annotations

import json
import os
import sys
import time
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace

import pytest

from nccl_doctor.analysis import analyze
from nccl_doctor.analysis.diagnose import NOT_RECORDED_NOTE
from nccl_doctor.analysis.what.exited import HINT_EARLY, HINT_RENDEZVOUS
from nccl_doctor.capture.early_exit import MAX_BYTES, MAX_FRAMES, read_early_exits, write_early_exit
from nccl_doctor.capture.live_captures import LiveCaptures
from nccl_doctor.analysis.calls.loaded import load_capture_dir
from nccl_doctor.capture.manifest import Manifest
from nccl_doctor.capture.names import EARLY_EXIT_SUFFIX, remove_own_files
from nccl_doctor.diagnosis import FindingKind, Verdict
from nccl_doctor.model import EarlyExit, Location, TraceSet
from nccl_doctor.rank import early_exit

T0 = 1_700_000_000_000_000_000
SITE = Location("/job/train.py", 12, "main")


def raised(message: str = "'lr'", *, line: int = 12, in_init: bool = False,
           time_ns: int = T0, frames: int = 2) -> dict:
    """What a rank's excepthook hands the writer for ``KeyError: message`` at train.py:line."""
    return {"type": "KeyError", "message": message, "path": "/job/train.py", "line": line,
            "function": "main", "in_init": in_init, "time_ns": time_ns,
            "traceback": [{"path": "/job/train.py", "line": line + i, "function": f"f{i}"}
                          for i in range(frames)]}


def job_dir(tmp_path: Path, exit_status: int | None = 1) -> Path:
    out = tmp_path / "out"
    out.mkdir()
    Manifest(command=("torchrun", "train.py"), started_at=T0 / 1e9, run_id="r",
             ended_at=T0 / 1e9 + 5, exit_status=exit_status).write(out)
    return out


# -- the record ------------------------------------------------------------------------------

def test_a_record_reads_back_as_the_rank_wrote_it(tmp_path: Path) -> None:
    path = write_early_exit(tmp_path, 1, 2, "node0", raised(frames=12))
    assert path is not None and path.name == f"rank00001.node0.{os.getpid()}{EARLY_EXIT_SUFFIX}"
    assert [p.name for p in tmp_path.iterdir()] == [path.name]  # (its temporary file renamed)
    found, notes = read_early_exits(tmp_path)
    assert notes == []
    ended, world = found[1]
    assert world == 2 and ended.exception == "KeyError: 'lr'" and ended.callsite == SITE
    assert ended.host == "node0" and ended.pid == os.getpid() and ended.time_ns == T0
    assert not ended.in_init and len(ended.traceback) == MAX_FRAMES
    assert ended.traceback[0] == Location("/job/train.py", 12, "f0")


def test_a_record_stays_bounded(tmp_path: Path) -> None:
    """A huge message, escaped non-ASCII paths: what is written fits MAX_BYTES."""
    big = raised("é" * 100_000, frames=50)
    big["path"] = "/" + "é" * 5000
    for frame in big["traceback"]:
        frame["path"] = "/" + "ü" * 5000
    path = write_early_exit(tmp_path, 0, 1, "h" * 1000, big)
    assert path is not None and path.stat().st_size <= MAX_BYTES
    ended = read_early_exits(tmp_path)[0][0][0]
    assert ended.exception.startswith("KeyError: ééé") and len(ended.host) <= 200


def test_a_record_that_cannot_be_made_never_raises(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("")
    assert write_early_exit(blocker / "out", 0, 1, "h", raised()) is None  # a file in the way
    assert write_early_exit(tmp_path, 0, 1, "h", {"type": object()}) is not None  # str() of it


@pytest.mark.parametrize("content", [
    b"", b"\x00garbage", b'{"format": "nccl-doctor early exit", "rank": tr', b"[1]",
    b"[" * 5000, b'{"rank": 1, "type": "KeyError"}',  # not the format's
    b'{"format": "nccl-doctor early exit", "rank": 2, "type": "KeyError"}',  # another rank's
    b'{"format": "nccl-doctor early exit", "rank": 1, "type": 7}',
    b'{"format": "nccl-doctor early exit", "rank": 1, "message": "no type"}',
])
def test_a_damaged_record_is_a_note_never_a_rank(tmp_path: Path, content: bytes) -> None:
    out = job_dir(tmp_path)
    (out / f"rank00001.node0.4001{EARLY_EXIT_SUFFIX}").write_bytes(content)
    traces = load_capture_dir(out)
    assert traces.early_exits == {}
    assert any(p.startswith("rank 1's record of an exception before joining a process group "
                            f"(rank00001.node0.4001{EARLY_EXIT_SUFFIX}) is damaged")
               for p in traces.problems)
    d = analyze(traces, annotators=())
    assert d.findings == () and d.verdict is Verdict.CRASH  # (the job failed, nobody is blamed)


def test_an_oversized_or_odd_file_is_skipped_with_a_note_and_never_opened(tmp_path: Path) -> None:
    out = job_dir(tmp_path)
    (out / f"rank00001.node0.1{EARLY_EXIT_SUFFIX}").write_bytes(b" " * (MAX_BYTES + 1))
    (out / f"notes{EARLY_EXIT_SUFFIX}").write_text("{}")
    (out / f"rank00002.node0.2{EARLY_EXIT_SUFFIX}").mkdir()
    os.mkfifo(out / f"rank00003.node0.3{EARLY_EXIT_SUFFIX}")  # open() would block
    found, notes = read_early_exits(out)
    assert found == {}
    assert notes[0] == (f"notes{EARLY_EXIT_SUFFIX} skipped: not an nccl-doctor record of a rank "
                        "that raised before joining a process group")
    assert notes[1].startswith(f"rank00001.node0.1{EARLY_EXIT_SUFFIX} skipped: 16,385 bytes")
    assert len(notes) == 4
    remove_own_files(out)  # ours, but a directory of that name is left alone
    assert sorted(p.name for p in out.iterdir()) == [f"rank00002.node0.2{EARLY_EXIT_SUFFIX}"]


def test_a_rank_restarted_is_told_by_its_latest_record(tmp_path: Path) -> None:
    write_early_exit(tmp_path, 1, 2, "h", raised("'old'", time_ns=T0))
    (tmp_path / f"rank00001.h.{os.getpid()}{EARLY_EXIT_SUFFIX}").rename(
        tmp_path / f"rank00001.h.1{EARLY_EXIT_SUFFIX}")
    write_early_exit(tmp_path, 1, 2, "h", raised("'new'", time_ns=T0 + 1))
    found, notes = read_early_exits(tmp_path)
    assert found[1][0].exception == "KeyError: 'new'"
    assert notes == ["rank 1 raised before joining a process group 2 times (a launcher's "
                     "restarts?): its latest is reported"]


def test_a_rank_that_has_a_capture_is_told_by_it(tmp_path: Path) -> None:
    """A record of a rank that also joined (another process: a restart) yields to its capture."""
    from nccl_doctor.capture import format as fmt
    from nccl_doctor.capture.writer import CaptureWriter

    out = job_dir(tmp_path)
    w = CaptureWriter(out / f"rank00001.h.7{fmt.CAPTURE_SUFFIX}",
                      {"rank": 1, "world_size": 2, "host": "h", "pid": 7, "started_ns": T0})
    w.note("exit")
    w.close()
    write_early_exit(out, 1, 2, "h", raised())
    traces = load_capture_dir(out, job_ended=True)
    assert traces.early_exits == {} and 1 in traces.ranks
    assert any("rank 1 joined in another process" in p for p in traces.problems)


def test_the_live_reader_sees_a_record_that_arrives_after_its_first_look(tmp_path: Path) -> None:
    out = job_dir(tmp_path, None)
    live = LiveCaptures(out)
    first = live.load()
    assert first.early_exits == {} and live.load() is first
    write_early_exit(out, 1, 2, "h", raised())
    now = live.load()
    assert set(now.early_exits) == {1} and now.world_size == 2 and live.load() is now
    assert set(live.final().early_exits) == {1}
    live.close()


# -- the rank side -----------------------------------------------------------------------------

@pytest.fixture
def environ(monkeypatch: pytest.MonkeyPatch):
    """No launcher variable, no launcher module: set what a test needs."""
    for names in (early_exit.env.LAUNCHER_RANK, early_exit.env.LAUNCHER_LOCAL_RANK,
                  early_exit.env.LAUNCHER_WORLD_SIZE):
        for name in names:
            monkeypatch.delenv(name, raising=False)
    for name in early_exit.LAUNCHERS:
        monkeypatch.delitem(sys.modules, name, raising=False)
    return monkeypatch


def test_which_process_is_a_rank(environ: pytest.MonkeyPatch) -> None:
    environ.setenv("RANK", "3")
    environ.setenv("WORLD_SIZE", "4")
    assert early_exit.rank_here() == (3, 4)
    environ.setenv("WORLD_SIZE", "2")  # not believed: rank 3 of 2
    assert early_exit.rank_here() == (3, 0)
    environ.delenv("RANK")
    environ.setenv("SLURM_PROCID", "5")
    assert early_exit.rank_here() == (5, 0)
    environ.setenv("RANK", "x")
    assert early_exit.rank_here() is None
    environ.setenv("RANK", "1")
    environ.setitem(sys.modules, "torch.distributed.run", SimpleNamespace())  # torchrun's agent
    assert early_exit.rank_here() is None


def test_a_single_process_is_rank_0_when_it_imported_torch_distributed(
        environ: pytest.MonkeyPatch) -> None:
    environ.setitem(sys.modules, "torch.distributed", SimpleNamespace())
    assert early_exit.rank_here() == (0, 1)
    environ.delitem(sys.modules, "torch.distributed")
    assert early_exit.rank_here() is None  # a program with no torch.distributed


def fake_recorder(directory: Path, joined: bool = False) -> SimpleNamespace:
    """What the excepthook reads of the recorder: where its captures go, whether it joined."""
    return SimpleNamespace(directory=directory, writer=None, joined=joined)


def raise_and_hook(hook) -> tuple:
    def main() -> None:
        settings = {}
        settings["lr"]  # noqa: B018 - the user's error

    try:
        main()
    except KeyError:
        info = sys.exc_info()
    hook(*info)
    return info


def test_the_excepthook_records_a_rank_that_has_not_joined_and_chains(
        environ: pytest.MonkeyPatch, tmp_path: Path) -> None:
    seen = []
    environ.setattr(sys, "excepthook", lambda *a: seen.append(a))
    environ.setenv("RANK", "1")
    environ.setenv("WORLD_SIZE", "2")
    recorder = fake_recorder(tmp_path)
    early_exit.arm(recorder)
    info = raise_and_hook(sys.excepthook)
    assert seen == [info]  # the previous hook printed it, as before
    ended, world = read_early_exits(tmp_path)[0][1]
    assert world == 2 and ended.exception == "KeyError: 'lr'"
    assert ended.callsite.path == __file__ and ended.callsite.function == "main"
    assert ended.traceback[0].function == "main" and not ended.in_init
    assert abs(ended.time_ns - time.time_ns()) < 60e9


def test_the_excepthook_leaves_a_joined_rank_to_its_capture(
        environ: pytest.MonkeyPatch, tmp_path: Path) -> None:
    seen = []
    environ.setattr(sys, "excepthook", lambda *a: seen.append(a))
    environ.setenv("RANK", "1")
    early_exit.arm(fake_recorder(tmp_path, joined=True))
    raise_and_hook(sys.excepthook)
    assert len(seen) == 1 and list(tmp_path.iterdir()) == []


def test_the_excepthook_never_loses_the_exception_when_recording_fails(
        environ: pytest.MonkeyPatch, tmp_path: Path) -> None:
    seen = []
    environ.setattr(sys, "excepthook", lambda *a: seen.append(a))
    environ.setenv("RANK", "1")

    def broken(*_args):
        raise RuntimeError("the doctor's bug")

    environ.setattr(early_exit, "record", broken)
    early_exit.arm(fake_recorder(tmp_path))
    info = raise_and_hook(sys.excepthook)
    assert seen == [info]


def test_an_exception_inside_init_process_group_is_marked(
        environ: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """A frame of torch's init_process_group on the way: the rank reached the rendezvous."""
    environ.setenv("RANK", "0")
    code = compile("def init_process_group():\n    raise RuntimeError('wait timeout')\n",
                   "/site-packages/torch/distributed/distributed_c10d.py", "exec")
    namespace: dict = {}
    exec(code, namespace)
    try:
        namespace["init_process_group"]()
    except RuntimeError:
        info = sys.exc_info()
    assert early_exit.record(tmp_path, *info) is not None
    ended = read_early_exits(tmp_path)[0][0][0]
    assert ended.in_init and ended.exception == "RuntimeError: wait timeout"


# -- the analysis --------------------------------------------------------------------------------

def early(exception: str = "KeyError: 'lr'", site: Location | None = SITE, *, pid: int = 100,
          in_init: bool = False, time_ns: int = T0) -> EarlyExit:
    return EarlyExit(exception, site, host="node0", pid=pid, time_ns=time_ns, in_init=in_init,
                     traceback=(site,) if site else ())


def job(world: int, **ranks: EarlyExit) -> TraceSet:
    return TraceSet(ranks={}, groups={}, world_size=world, exit_status=1,
                    early_exits={int(r.removeprefix("r")): e for r, e in ranks.items()})


def test_a_rank_that_raised_before_joining_is_the_root_cause() -> None:
    d = analyze(job(2, r1=early()), annotators=())
    root = d.root_cause
    assert d.verdict is Verdict.CRASH and root.kind is FindingKind.RANK_EXITED
    assert root.title == "rank 1 raised KeyError: 'lr' at /job/train.py:12 before joining a " \
                         "process group"
    assert root.callsite == "/job/train.py:12" and root.hint == HINT_EARLY
    assert "max-restarts" not in root.hint and root.ranks == (1,)
    assert "rank 0 left no record" in root.detail
    assert NOT_RECORDED_NOTE not in d.notes
    rows = {r.rank: (r.state, r.pid, r.exit_detail) for r in d.ranks}
    assert rows == {0: ("no_capture", 0, "left no capture"),
                    1: ("exception", 100, "raised KeyError: 'lr' at /job/train.py:12 before "
                                          "joining a process group")}


def test_ranks_that_raised_the_same_are_one_finding() -> None:
    d = analyze(job(3, r0=early(pid=1), r1=early(pid=2), r2=early("ImportError: no x", pid=3,
                                                                  time_ns=T0 + 5)),
                annotators=())
    titles = [f.title for f in d.findings]
    assert titles == ["ranks 0, 1 raised KeyError: 'lr' at /job/train.py:12 before joining a "
                      "process group",
                      "rank 2 raised ImportError: no x at /job/train.py:12 before joining a "
                      "process group"]
    assert d.findings[0].root_cause and d.findings[0].evidence["pids"] == {"0": 1, "1": 2}


def test_a_rank_that_timed_out_in_init_waiting_for_it_is_a_consequence() -> None:
    """Rank 0 reached init_process_group and timed out (before rank 1 raised, even): rank 1's
    error is the cause, rank 0's timeout what followed."""
    timeout = early("DistStoreError: wait timeout after 20000ms", in_init=True, time_ns=T0 - 9)
    d = analyze(job(2, r0=timeout, r1=early(time_ns=T0)), annotators=())
    assert [f.ranks for f in d.findings] == [(1,)] and d.root_cause.ranks == (1,)
    assert "rank 0 then raised DistStoreError: wait timeout after 20000ms in init_process_group" \
        in d.root_cause.detail
    assert d.root_cause.evidence["consequences"][0]["rank"] == 0
    assert {r.rank: r.state for r in d.ranks} == {0: "exception", 1: "exception"}


def test_ranks_that_all_timed_out_in_init_are_the_finding() -> None:
    timeout = early("DistStoreError: wait timeout", in_init=True)
    d = analyze(job(4, r0=timeout, r1=timeout), annotators=())
    root = d.root_cause
    assert root.ranks == (0, 1) and root.hint == HINT_RENDEZVOUS
    assert "ranks 2, 3 left no record" in root.detail


def test_a_raise_with_no_line_of_the_users_says_no_line() -> None:
    d = analyze(job(1, r0=early("SystemError: boom", None)), annotators=())
    assert d.root_cause.title == "rank 0 raised SystemError: boom before joining a process group"
    assert d.root_cause.callsite is None


def test_a_rank_that_raised_once_the_job_was_stopped_is_no_cause() -> None:
    from nccl_doctor.watch_log import Interrupted, WatchLog

    watch = WatchLog((Interrupted(("SIGINT",), "user", T0 / 1e9),))
    assert watch.stopped_at == T0 / 1e9
    traces = replace(job(2, r0=early("KeyboardInterrupt", time_ns=T0 + 1)), watch=watch)
    d = analyze(traces, annotators=())
    assert d.findings == () and [r.state for r in d.ranks if r.rank == 0] == ["stopped"]


def test_nothing_recorded_is_still_not_recorded() -> None:
    d = analyze(TraceSet(ranks={}, groups={}, world_size=0, exit_status=1), annotators=())
    assert NOT_RECORDED_NOTE in d.notes and d.findings == ()
    d = analyze(TraceSet(ranks={}, groups={}, world_size=0, exit_status=0), annotators=())
    assert d.verdict is Verdict.NOT_RECORDED


def test_replay_of_a_directory_with_records_gives_the_finding(tmp_path: Path) -> None:
    out = job_dir(tmp_path)
    write_early_exit(out, 1, 2, "node0", raised())
    d = analyze(load_capture_dir(out), annotators=())
    assert d.verdict is Verdict.CRASH and d.world_size == 2
    assert d.root_cause.title.startswith("rank 1 raised KeyError: 'lr' at ")
    assert json.loads(d.to_json_text())["findings"][0]["evidence"]["before_joining"] is True
