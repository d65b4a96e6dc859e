"""One capture-set reader (capture/capture_set.py): each file of a job read once, the newest
capture of each rank picked once across node directories, the records held in one form, and
nothing in capture/ importing the analysis above it."""

from __future__ import annotations

import ast
import collections
import json
import sys
from pathlib import Path

import pytest

from nccl_doctor.analysis.calls.loaded import load, loaded
from nccl_doctor.capture import format as fmt
from nccl_doctor.capture.capture_set import CaptureSet, node_dirs
from nccl_doctor.capture.follow import CaptureFollower, read_capture
from nccl_doctor.capture.manifest import Manifest
from nccl_doctor.capture.union import newest_per_rank
from nccl_doctor.capture.writer import CaptureWriter
from nccl_doctor.model import EventKind, EventState, ExitKind

ROOT = Path(__file__).resolve().parents[2]
T0 = 1_700_000_000_000_000_000


def capture(directory: Path, rank: int, calls: int, *, world: int = 2, started: int = T0,
            host: str = "node0", pid: int | None = None, exit: bool = True) -> CaptureWriter:
    pid = pid if pid is not None else 100 + rank
    w = CaptureWriter(directory / f"rank{rank:05d}.{host}.{pid}{fmt.CAPTURE_SUFFIX}",
                      {"rank": rank, "world_size": world, "host": host, "pid": pid,
                       "started_ns": started})
    w.note("group", name="0", ranks=list(range(world)), backend="gloo")
    site = w.intern("/job/train.py")
    for i in range(calls):
        idx = w.begin((0, started + i * 1000, i + 1, 256, 1, w.intern("all_reduce"),
                       w.intern("0"), w.intern("float32[8]"), 0, site, 10, w.intern("step"),
                       site, 10, 0, -1, world, 0, int(EventKind.COLLECTIVE), 0, 0))
        w.end(idx, int(EventState.RETURNED), 1)
    if exit:
        w.note("exit")
    return w


def node(root: Path, name: str, ranks: list[int], *, role: str, node_rank: int,
         world: int = 4) -> Path:
    out = root / name
    out.mkdir()
    for r in ranks:
        capture(out, r, 3, world=world, host=name)
    Manifest(command=("python", "t.py"), started_at=1.0, run_id="r", world_size=world,
             ended_at=2.0, exit_status=0,
             extra={"node": {"role": role, "node_rank": node_rank, "host": name}}).write(out)
    return out


@pytest.fixture
def opened(monkeypatch):
    """Counts each file's opens (the audit hook sees open() and os.open alike)."""
    seen: collections.Counter[str] = collections.Counter()
    active = [True]

    def hook(event: str, args: tuple) -> None:
        if active[0] and event == "open" and isinstance(args[0], (str, Path)):
            seen[Path(args[0]).name] += 1

    sys.addaudithook(hook)  # (audit hooks cannot be removed: switched off after the test)
    yield seen
    active[0] = False


def job_dir(tmp_path: Path) -> Path:
    out = tmp_path / "job"
    out.mkdir()
    for r in range(2):
        capture(out, r, 4)
    Manifest(command=("python", "t.py"), started_at=1.0, run_id="r", world_size=2,
             ended_at=2.0, exit_status=0).write(out)
    (out / "watchdog.json").write_text(json.dumps(
        {"format": "nccl-doctor-watchdog", "version": 1, "events": []}))
    return out


def test_a_replay_reads_each_file_once(tmp_path, opened):
    out = job_dir(tmp_path)
    opened.clear()
    traces = load(out)
    assert set(traces.ranks) == {0, 1}
    assert opened["manifest.json"] == 1
    assert opened["watchdog.json"] == 1
    assert opened["rank00000.node0.100.ndcap"] == 1 and opened["rank00001.node0.101.ndcap"] == 1


def test_the_python_api_reads_each_capture_once_for_its_tables_and_its_traces(tmp_path, opened):
    import nccl_doctor

    out = job_dir(tmp_path)
    opened.clear()
    job = nccl_doctor.open(out)
    assert len(job.calls) == 8  # the table first: the header picks, the columns are held
    assert list(job.ranks["exit"]) == [ExitKind.CLEAN.value] * 2
    job.diagnose()
    assert opened["manifest.json"] == 1 and opened["watchdog.json"] == 1
    # each capture: its header when the table picked it, its records once
    assert opened["rank00000.node0.100.ndcap"] == 2 and opened["rank00001.node0.101.ndcap"] == 2


def test_traces_first_then_the_table_read_each_capture_once(tmp_path, opened):
    import nccl_doctor

    out = job_dir(tmp_path)
    opened.clear()
    job = nccl_doctor.open(out)
    job.ranks
    assert len(job.calls) == 8
    assert opened["rank00000.node0.100.ndcap"] == 1 and opened["rank00001.node0.101.ndcap"] == 1


def test_a_node_tree_is_expanded_once_the_leader_first(tmp_path):
    root = tmp_path / "nodes"
    root.mkdir()
    b = node(root, "a_follower", [2, 3], role="follower", node_rank=1)
    a = node(root, "b_leader", [0, 1], role="leader", node_rank=0)
    assert node_dirs(root) == [b, a]
    captures = CaptureSet(root)
    assert captures.directories == [a, b]  # the leader's record is the job's
    assert sorted(captures.chosen()) == [0, 1, 2, 3]
    traces = loaded(captures)
    assert sorted(traces.ranks) == [0, 1, 2, 3] and traces.partial == ""
    assert {t.exit.kind for t in traces.ranks.values()} == {ExitKind.CLEAN}


def test_a_rank_found_on_two_nodes_keeps_its_newest_capture_and_says_so(tmp_path):
    root = tmp_path / "nodes"
    root.mkdir()
    a = node(root, "a", [0, 1], role="leader", node_rank=0)
    b = node(root, "b", [2, 3], role="follower", node_rank=1)
    newer = capture(b, 1, 5, world=4, started=T0 + 10, host="b", pid=777)
    captures = CaptureSet(a, b)
    assert captures.chosen()[1] == newer.path
    traces = loaded(captures)
    assert len(traces.ranks[1].events) == 5
    (said,) = [p for p in traces.problems if "rank 1" in p]
    assert "two nodes" in said and "b:rank00001.b.777.ndcap" in said


def test_a_restarted_rank_keeps_its_newest_capture_in_one_directory(tmp_path):
    out = tmp_path / "job"
    out.mkdir()
    capture(out, 0, 2, world=1, started=T0 + 5, pid=900)
    newer = capture(out, 0, 6, world=1, started=T0 + 9, pid=50)
    captures = CaptureSet(out, replay=False)
    assert captures.chosen() == {0: newer.path}
    traces = captures.traces()
    assert traces.ranks[0].path == str(newer.path)
    (said,) = traces.problems
    assert "several captures" in said and "ignoring rank00000.node0.900.ndcap" in said


def test_newest_per_rank_takes_the_later_started_and_the_later_given_on_a_tie():
    found = [("a", 0, 5), ("b", 0, 9), ("c", 1, 3), ("d", 1, 3), ("e", 0, 1)]
    newest, passed = newest_per_rank(found, lambda f: (f[1], f[2]))
    assert {r: f[0] for r, f in newest.items()} == {0: "b", 1: "d"}
    assert sorted((o[0], n[0]) for o, n in passed) == [("a", "b"), ("c", "d"), ("e", "b")]


def test_the_traces_are_made_once_per_settling(tmp_path):
    captures = CaptureSet(job_dir(tmp_path))
    assert loaded(captures) is loaded(captures)
    assert captures.traces() is captures.traces()


def test_columns_are_held_only_when_asked(tmp_path):
    out = job_dir(tmp_path)
    plain = CaptureSet(out)
    plain.traces()
    assert all(plain.held_scan(p) is None for p in plain.chosen().values())
    held = CaptureSet(out, hold_columns=True)
    held.traces()
    assert all(held.held_scan(p) is not None for p in held.chosen().values())


def test_a_follower_holds_its_records_as_columns_and_makes_only_new_events(tmp_path):
    w = capture(tmp_path, 0, 5, world=1, exit=False)
    with CaptureFollower(w.path) as follower:
        assert not hasattr(follower, "_slots")  # no second copy of the records as events
        first = follower.read()
        site = w.intern("/job/train.py")
        idx = w.begin((0, T0 + 99, 6, 256, 1, w.intern("all_reduce"), w.intern("0"),
                       w.intern("float32[8]"), 0, site, 10, w.intern("step"), site, 10, 0, -1,
                       1, 0, int(EventKind.COLLECTIVE), 0, 0))
        second = follower.read()
        assert second.events[:5] == first.events[:5]
        assert all(a is b for a, b in zip(first.events, second.events[:5]))  # views reused
        assert not second.events[5].done
        w.end(idx, int(EventState.RETURNED), 1)
        third = follower.read()
        assert third.events[5].done and third.events[5] is not second.events[5]
        assert third == read_capture(w.path)


def _imports(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(), filename=str(path))
    found = set()
    for n in ast.walk(tree):
        if isinstance(n, ast.Import):
            found.update(a.name for a in n.names)
        elif isinstance(n, ast.ImportFrom) and n.module and n.level == 0:
            found.add(n.module)
            found.update(f"{n.module}.{a.name}" for a in n.names)
    return found


#: What the capture package sits below: it reads files into the model, nothing decides there.
ABOVE = ("nccl_doctor.analysis", "nccl_doctor.reporters", "nccl_doctor.supervisor",
         "nccl_doctor.data", "nccl_doctor.cli", "nccl_doctor.serve")


def test_nothing_in_capture_imports_a_layer_above_it():
    wrong = sorted(f"{path.name} imports {name}"
                   for path in (ROOT / "nccl_doctor" / "capture").glob("*.py")
                   for name in _imports(path) if name.startswith(ABOVE))
    assert not wrong, "\n".join(wrong)


def test_the_import_walk_sees_an_upward_import(tmp_path):
    bad = tmp_path / "bad.py"
    bad.write_text("def f():\n    from nccl_doctor.analysis.calls.ends import with_ends_known\n")
    assert "nccl_doctor.analysis.calls.ends" in _imports(bad)
