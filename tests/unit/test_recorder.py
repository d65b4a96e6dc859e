"""The recorder's hot path on a fake torch.distributed: what it writes, through the C fast path
(capture/_ring.c's Call) and through the Python path, must be the same records, with the same
callsites and tensor descriptions, however often a call site, shape or code object comes back."""

from __future__ import annotations

import gc
import json
import sys
import threading
import weakref
from pathlib import Path
from types import CodeType, SimpleNamespace
from typing import Any, Callable

import pytest
import torch

from nccl_doctor.capture import format as fmt
from nccl_doctor.capture import ring as ring_mod
from nccl_doctor.model import EventFlag, EventKind, EventState
from nccl_doctor.rank.recorder import arguments, wrappers
from nccl_doctor.rank.recorder.core import Recorder
from nccl_doctor.rank.recorder.specs import SPECS
from nccl_doctor.rank.recorder.wrappers import BoundCall, wrap

HAS_FAST = ring_mod.fast_path() is not None
PATHS = ["fast", "python"] if HAS_FAST else ["python"]
needs_fast = pytest.mark.skipif(not HAS_FAST, reason="the C ring was not built (no compiler)")


class FakeGroup:
    """A process group as the recorder sees one: a size and a sequence number."""

    def __init__(self, name: str, ranks: tuple[int, ...]) -> None:
        self.name, self.ranks, self.seq = name, ranks, 0

    def size(self) -> int:
        return len(self.ranks)

    def _get_sequence_number_for_group(self) -> int:
        return self.seq


class FakeWork:
    def wait(self) -> bool:
        return True


class FakeDist:
    """torch.distributed's functions (their real signatures), recorded by one Recorder."""

    def __init__(self, tmp_path: Path, path: str) -> None:
        self.world = FakeGroup("0", (0, 1))
        self.c10d = SimpleNamespace(
            get_rank=lambda: 0, get_world_size=lambda: 2,
            _get_default_group=lambda: self.world,
            _get_process_group_name=lambda pg: pg.name,
            get_process_group_ranks=lambda pg: pg.ranks,
            get_backend=lambda pg=None: "gloo",
        )
        self.rec = rec = Recorder(tmp_path / path, capacity=256, strtab_bytes=1 << 16)
        if path == "python":  # as without the C extension: every call takes the Python path
            rec.recording = rec._call_type = None
        rec.c10d = self.c10d
        rec._hooks_installed = True  # no atexit / excepthook / faulthandler in the test process
        self.taken: list[str] = []  # which path recorded each call ("fast" or "python")
        self.inside: Callable[[], None] | None = None  # run inside all_gather_object
        for name, fn in self._functions().items():
            call = BoundCall(next(s for s in SPECS if s.name == name), fn)
            rec._calls.append(call)
            setattr(self, name, wrap(rec, call, fn))
        rec.open()

    def _bump(self, group: Any) -> None:
        (group if isinstance(group, FakeGroup) else self.world).seq += 1
        caller = sys._getframe(2).f_code  # the Python path's wrapper, or the test's frame
        self.taken.append("python" if caller is PYTHON_WRAPPER else "fast")

    def _functions(self) -> dict[str, Callable]:
        bump = self._bump

        def all_reduce(tensor, op=None, group=None, async_op=False):
            bump(group)
            return FakeWork() if async_op else None

        def broadcast(tensor, src=None, group=None, async_op=False, group_src=None):
            bump(group)

        def all_gather(tensor_list, tensor, group=None, async_op=False):
            bump(group)

        def all_gather_object(object_list, obj, group=None):
            if self.inside is not None:
                self.inside()
            inner = [torch.zeros(1) for _ in object_list]
            self.all_gather(inner, torch.zeros(1), group=group)  # nested: a child record

        return {"all_reduce": all_reduce, "broadcast": broadcast, "all_gather": all_gather,
                "all_gather_object": all_gather_object}

    def records(self) -> list[dict[str, Any]]:
        """Every record, strings resolved, times left out (they differ between runs)."""
        w = self.rec.writer
        text = {sid: s for s, sid in w._strings.items()}
        out = []
        for idx in range(1, w.count + 1):
            f = w.record(idx)
            off = w.ring_offset + (idx - 1) % w.capacity * fmt.RECORD_SIZE + fmt.EXIT_OFFSET
            t_exit, delta, state, _check = fmt.EXIT.unpack_from(w.ring, off)
            out.append({
                "parent": f[1], "seq": f[3], "nbytes": f[4], "thread": f[5], "op": text[f[6]],
                "group": text[f[7]], "input": text[f[8]], "output": text[f[9]],
                "user": (Path(text[f[10]]).name, f[11], text[f[12]]),
                "api": (Path(text[f[13]]).name, f[14]), "path": call_path(text, f[15]),
                "peer": f[16], "group_size": f[17],
                "seq_offset": f[18], "kind": EventKind(f[19]), "flags": EventFlag(f[20]),
                "state": EventState(state) if t_exit else None, "delta": delta,
            })
        return out


def call_path(text: dict[int, str], sid: int) -> list[tuple[str, int, str]]:
    """A record's call path: (file name, line, function) per frame, innermost first."""
    out = []
    for part in text[sid].split():
        f, line, fn = (int(x) for x in part.split(":"))
        out.append((Path(text[f]).name, line, text[fn]))
    return out


# the code of the Python path's wrapper: a call the C fast path records (a Recorded) has no
# Python frame between its caller and the function
PYTHON_WRAPPER = next(c for c in wrappers._recorded.__code__.co_consts
                      if isinstance(c, CodeType) and c.co_name == "wrapper")


@pytest.fixture(params=PATHS)
def dist(request, tmp_path) -> FakeDist:
    return FakeDist(tmp_path, request.param)


def scenario(d: FakeDist) -> None:
    """Calls of every shape the hot path handles, each made twice (cold cache, warm cache)."""
    pair = FakeGroup("pair", (1, 3))
    d.rec.group(pair)
    for _ in range(2):
        t = torch.ones(4)
        d.all_reduce(t)
        d.all_reduce(t, group=pair)
        d.all_reduce(torch.zeros(2, 3, dtype=torch.int64), None, None)
        d.broadcast(t, src=1)
        d.broadcast(t, group=pair, group_src=1)  # a group rank: recorded as global rank 3
        d.all_gather([torch.zeros(4), torch.zeros(4)], t)
        d.all_gather([torch.zeros(4), torch.zeros(5)], t)  # not uniform
        d.all_gather([torch.zeros(1)] * 17, t)  # long: described by its first member
        d.all_gather([], t)
        d.all_gather_object([None, None], {"x": 1})
        work = d.all_reduce(t, async_op=True)
        assert isinstance(work, FakeWork)


def test_the_scenario_is_recorded(dist) -> None:
    scenario(dist)
    recs = dist.records()
    first = recs[: len(recs) // 2]
    assert [r["op"] for r in first] == [
        "all_reduce", "all_reduce", "all_reduce", "broadcast", "broadcast", "all_gather",
        "all_gather", "all_gather", "all_gather", "all_gather_object", "all_gather",
        "all_reduce",
    ]
    assert [r["input"] for r in first] == [
        "float32[4]", "float32[4]", "int64[2,3]", "float32[4]", "float32[4]", "float32[4]",
        "float32[4]", "float32[4]", "float32[4]", "object", "float32[1]", "float32[4]",
    ]
    assert [r["output"] for r in first[5:9]] == [
        "2*float32[4]", "float32[4];float32[5]", "17*float32[1]", "[]",
    ]
    assert first[0]["nbytes"] == 16 and first[2]["nbytes"] == 48
    assert [r["group"] for r in first[:2]] == ["0", "pair"]
    assert [r["group_size"] for r in first[:2]] == [2, 2]
    assert [r["peer"] for r in first[3:5]] == [1, 3]
    assert first[10]["parent"] == 10 and first[9]["parent"] == 0  # nested in the object call
    assert first[11]["flags"] == EventFlag.ASYNC and first[11]["state"] == EventState.ISSUED
    assert all(r["state"] == EventState.RETURNED for r in first[:11])
    assert first[9]["delta"] == 1  # composite: measured (its inner all_gather advanced seq)
    # the object call and its inner all_gather share a seq: the inner one advances it
    assert [r["seq"] for r in first if r["group"] == "0"] == [1, 2, 3, 4, 5, 6, 7, 8, 8, 9]
    # the callsite is this file's ``scenario``; the API caller is the same frame
    here = Path(__file__).name
    assert all(r["user"][0] == here and r["user"][2] == "scenario" for r in recs
               if r["op"] != "all_gather" or r["parent"] == 0)
    assert all(r["api"] == r["user"][:2] for r in recs if r["parent"] == 0)
    assert recs[len(recs) // 2:] == [  # the second round differs in seq and parents only
        dict(r, seq=r["seq"] + (9 if r["group"] == "0" else 2),
             parent=r["parent"] + 12 if r["parent"] else 0)
        for r in first
    ]


@needs_fast
def test_fast_and_python_paths_write_the_same_records(tmp_path) -> None:
    fast, python = FakeDist(tmp_path, "fast"), FakeDist(tmp_path, "python")
    scenario(fast)
    scenario(python)
    assert fast.records() == python.records()
    assert set(python.taken) == {"python"}
    # the second round (warm caches) went through the C fast path, but for the list that is not
    # uniform, which the Python path describes every time
    assert len(fast.taken) == 22
    assert fast.taken[11:] == ["fast"] * 6 + ["python"] + ["fast"] * 4


@needs_fast
def test_the_python_path_is_made_when_the_fast_path_first_declines(tmp_path, monkeypatch) -> None:
    made: list[str] = []
    real = wrappers._recorded

    def counted(rec, call, fn):
        made.append(call.spec.name)
        return real(rec, call, fn)

    monkeypatch.setattr(wrappers, "_recorded", counted)
    d = FakeDist(tmp_path, "fast")
    t = torch.ones(4)
    for _ in range(2):  # the first call of a line is cold (the Python path), the next fast
        d.all_reduce(t)
        d.all_gather([torch.zeros(4), torch.zeros(4)], t)
    assert made == ["all_reduce", "all_gather"]  # each once, at its first call
    assert d.taken == ["python", "python", "fast", "fast"]
    for _ in range(2):  # not uniform: the Python path every time, made once
        d.all_gather([torch.zeros(4), torch.zeros(5)], t)
    assert made == ["all_reduce", "all_gather"] and d.taken[4:] == ["python", "python"]
    assert [r["output"] for r in d.records()][-2:] == ["float32[4];float32[5]"] * 2


@needs_fast
def test_a_python_path_that_cannot_be_made_disables_the_recorder_not_the_call(
        tmp_path, monkeypatch, capsys) -> None:
    def broken(rec, call, fn):
        raise RuntimeError("no room for the closure")

    monkeypatch.setattr(wrappers, "_recorded", broken)
    d = FakeDist(tmp_path, "fast")
    t = torch.ones(4)
    assert d.all_reduce(t) is None and d.world.seq == 1  # the call ran, unrecorded
    assert "recorder disabled" in capsys.readouterr().err
    assert d.rec.writer.count == 0 and d.all_reduce(t) is None and d.world.seq == 2


def call_from_two_lines(d: FakeDist, t: torch.Tensor) -> None:
    d.all_reduce(t)
    d.all_reduce(t)


def test_one_function_calling_from_two_lines(dist) -> None:
    t = torch.ones(2)
    for _ in range(3):
        call_from_two_lines(dist, t)
    lines = [r["user"][1] for r in dist.records()]
    first = call_from_two_lines.__code__.co_firstlineno
    assert lines == [first + 1, first + 2] * 3
    assert {r["user"][2] for r in dist.records()} == {"call_from_two_lines"}


SOURCE = "def step(d, t):\n" + "\n" * 6 + "    d.all_reduce(t)\n"


def test_recreated_code_objects_get_their_own_callsites(dist, monkeypatch) -> None:
    """exec'd (and re-exec'd) code: new code objects, some at the address of freed ones."""
    monkeypatch.setattr(arguments, "CACHE_LIMIT", 5)  # and caches emptied along the way
    t = torch.ones(2)
    expected = []
    for i in range(12):
        namespace: dict[str, Any] = {}
        exec(compile("\n" * i + SOURCE, f"/job/gen{i % 3}.py", "exec"), namespace)
        for _ in range(2):
            namespace["step"](dist, t)
            expected.append((f"gen{i % 3}.py", i + 8, "step"))
        del namespace
        gc.collect()
    assert [r["user"] for r in dist.records()] == expected
    assert [r["path"] for r in dist.records()] == [[e] for e in expected]  # a direct call
    d = dist.rec.describer
    assert len(d.positions) <= 5 and len(d.direct) <= 5 and len(d._code) <= 5


def test_callsite_walks_past_torch_and_wrapping_libraries(dist) -> None:
    """The user callsite is the first frame outside torch and its wrappers; the API callsite
    the first outside torch (here: an accelerate frame)."""
    namespace: dict[str, Any] = {}
    exec(compile("def reduce(d, t):\n    d.all_reduce(t)\n",
                 "/env/site-packages/torch/distributed/helpers.py", "exec"), namespace)
    exec(compile("def gather(d, t, inner):\n\n    inner(d, t)\n",
                 "/env/site-packages/accelerate/utils/ops.py", "exec"), namespace)
    t = torch.ones(3)
    for _ in range(3):
        namespace["gather"](dist, t, namespace["reduce"])  # line 1 of this loop's body
    line = sys._getframe().f_lineno - 1
    recs = dist.records()
    assert [r["user"] for r in recs] == [(Path(__file__).name, line,
                                          "test_callsite_walks_past_torch_and_wrapping_libraries")
                                         ] * 3
    assert [r["api"] for r in recs] == [("ops.py", 3)] * 3
    # the path: every frame outside torch, from the API's caller out to the user's
    assert [r["path"] for r in recs] == [[("ops.py", 3, "gather"), recs[0]["user"]]] * 3
    if dist.taken[0] == "python" and HAS_FAST and dist.rec.recording is not None:
        assert dist.taken[1:] == ["fast", "fast"]  # the path was found in the cache


LIBRARY = {  # a call made by a library: user -> trl's trainer -> accelerate's helper -> torch
    "/env/site-packages/trl/trainer/cpo_trainer.py":
        "def get_batch_loss_metrics(d, t, gather):\n    return gather(d, t)\n",
    "/env/site-packages/accelerate/utils/operations.py":
        "def gather(d, t):\n    d.all_gather([t, t], t)\n",
}


def library(depth: int = 0) -> dict[str, Any]:
    """The functions of LIBRARY, with ``depth`` frames of a trainer loop (transformers) between
    the user and trl's frame."""
    namespace: dict[str, Any] = {}
    for path, source in LIBRARY.items():
        exec(compile(source, path, "exec"), namespace)
    loop = "def loop(d, t, n, inner, gather):\n    if n:\n        return loop(d, t, n - 1, inner, gather)\n    return inner(d, t, gather)\n"
    exec(compile(loop, "/env/site-packages/transformers/trainer.py", "exec"), namespace)
    return namespace


@pytest.mark.parametrize("depth", [0, 3, 40])
def test_a_library_call_keeps_its_path(dist, depth) -> None:
    """The path names every frame between the user and torch (at most PATH_FRAMES, innermost
    first): the trainer loop, trl's line that decided to gather, accelerate's helper. The fast
    path records it from its cache from the second call on, the same as the Python path."""
    ns, t = library(), torch.ones(2)
    for _ in range(3):
        ns["loop"](dist, t, depth, ns["get_batch_loss_metrics"], ns["gather"])
    line = sys._getframe().f_lineno - 1
    recs = dist.records()
    user = (Path(__file__).name, line, "test_a_library_call_keeps_its_path")
    full = ([("operations.py", 2, "gather"), ("cpo_trainer.py", 2, "get_batch_loss_metrics"),
             ("trainer.py", 4, "loop")] + [("trainer.py", 3, "loop")] * depth + [user])
    assert [r["user"] for r in recs] == [user] * 3
    assert [r["path"] for r in recs] == [full[:arguments.PATH_FRAMES]] * 3
    if HAS_FAST and dist.rec.recording is not None:
        assert dist.taken == ["python", "fast", "fast"]


def test_a_sequence_number_moved_outside_the_recorder_is_read_on_the_fast_path(dist) -> None:
    group = FakeGroup("b", (0, 1))
    dist.rec.group(group)
    for step in range(6):  # one call line: cached from the second call on
        if step == 4:  # collectives issued from C++ (a DDP bucket) move it past the recorder
            group.seq += 5
        dist.all_reduce(torch.ones(1), group=group)
    assert [r["seq"] for r in dist.records()] == [1, 2, 3, 4, 10, 11]
    if dist.rec.recording is not None:
        assert dist.taken == ["python"] + ["fast"] * 5


def test_shapes_seen_alternately_and_many_shapes(dist, monkeypatch) -> None:
    monkeypatch.setattr(arguments, "CACHE_LIMIT", 8)
    # dimensions past 256 are new int objects on each read: compared by value, not identity
    big = [(300, 2), (300, 2), (301, 2), (2, 300), (2, 300, 1), (300, 2)]
    shapes = [(2,), (3, 1), (2,), (), (3, 1)] + [(n,) for n in range(1, 20)] + [(2,)] + big
    for shape in shapes:
        dist.all_reduce(torch.zeros(shape, dtype=torch.bfloat16))
    described = [(r["input"], r["nbytes"]) for r in dist.records()]
    assert described == [
        (f"bfloat16[{','.join(map(str, s))}]", 2 * int(torch.Size(s).numel())) for s in shapes
    ]
    assert len(dist.rec.describer.tensors) <= 8


def test_same_shape_other_dtype(dist) -> None:
    dtypes = [torch.float32, torch.int64, torch.int64, torch.float16, torch.float32]
    for dtype in dtypes:
        dist.all_reduce(torch.zeros(3, dtype=dtype))
    names = [str(d).rpartition(".")[2] for d in dtypes]
    assert [r["input"] for r in dist.records()] == [f"{n}[3]" for n in names]
    assert [r["nbytes"] for r in dist.records()] == [12, 24, 24, 6, 12]


def test_each_thread_keeps_its_own_call_stack(dist) -> None:
    """A call on another thread, made while this thread is inside a recorded call, is not that
    call's child; this thread's next call of the same function still is (the fast path
    remembers the stack of the thread it saw last). Twice: the second round is the fast path's,
    with every call line cached."""
    t = torch.ones(2)
    threads: list[int] = []

    def elsewhere() -> None:
        threads.append(threading.get_ident())
        dist.all_gather([torch.zeros(2)], t)  # the function all_gather_object calls inside

    def on_another_thread() -> None:
        worker = threading.Thread(target=elsewhere)
        worker.start()
        worker.join()

    dist.inside = on_another_thread
    for _ in range(2):
        dist.all_gather_object([None], 1)
    here = threading.get_ident()
    assert [(r["op"], r["parent"], r["thread"]) for r in dist.records()] == [
        ("all_gather_object", 0, here), ("all_gather", 0, threads[0]), ("all_gather", 1, here),
        ("all_gather_object", 0, here), ("all_gather", 0, threads[1]), ("all_gather", 4, here),
    ]


class Sized(torch.Tensor):
    """A tensor type whose ``shape`` a test redefines."""


def test_a_type_changed_between_calls_is_read_anew(dist) -> None:
    """The fast path reads ``shape`` through the descriptor it found on the tensor's type; a
    type given another ``shape`` after that is read by its new one (the bytes are the tensor's
    own ``nbytes``, whatever its shape says)."""
    t = torch.zeros(3).as_subclass(Sized)
    for step in range(4):  # one call line: the third and fourth calls find everything cached
        if step == 2:
            Sized.shape = property(lambda self: torch.Size([7]))  # type: ignore[assignment]
        if step == 3:
            del Sized.shape
        dist.all_reduce(t)
    assert [(r["input"], r["nbytes"]) for r in dist.records()] == [
        ("float32[3]", 12), ("float32[3]", 12), ("float32[7]", 12), ("float32[3]", 12)]


class Borrowed:
    """Not a tensor, with a tensor's ``shape`` descriptor: getattr refuses to apply it."""

    shape = torch.Tensor.shape


def test_a_borrowed_descriptor_is_not_applied_to_a_foreign_object(dist, capsys) -> None:
    """The fast path reads ``shape`` through the type's descriptor only for instances of the
    descriptor's own class; here getattr raises TypeError, so the recorder steps aside (one
    line) and the call goes on - instead of torch's getter reading a non-tensor."""
    t = torch.ones(2)
    dist.all_reduce(t)
    assert dist.all_reduce(Borrowed()) is None
    assert "recorder disabled" in capsys.readouterr().err
    assert dist.all_reduce(t) is None


class Dim(int):
    """A dimension whose comparison raises KeyboardInterrupt once, when armed."""

    armed = False

    def __eq__(self, other: object) -> bool:
        if Dim.armed:
            Dim.armed = False
            raise KeyboardInterrupt
        return int(self) == other

    __hash__ = int.__hash__


class DimShaped:
    """Tensor-like: each read of ``shape`` makes new Dim objects (compared, never identical)."""

    dtype, nbytes = torch.float32, 12

    @property
    def shape(self) -> tuple:
        return (Dim(3),)


def test_an_interrupt_while_comparing_shapes_reaches_the_caller(dist) -> None:
    """KeyboardInterrupt is the user's, even from a comparison the recorder makes: it is
    raised from the call (which does not run), not swallowed."""
    x = DimShaped()
    for _ in range(3):  # described, cached, then remembered by the call
        dist.all_reduce(x)
    before = dist.rec.writer.count
    Dim.armed = True
    with pytest.raises(KeyboardInterrupt):
        dist.all_reduce(x)
    assert not Dim.armed and dist.rec.writer.count == before
    dist.all_reduce(x)  # and the recorder goes on
    assert dist.rec.writer.count == before + 1 and dist.records()[-1]["input"] == "float32[3]"


def test_a_destroyed_group_is_not_kept_alive(dist) -> None:
    pair = FakeGroup("pair", (0, 1))
    dist.rec.group(pair)
    for _ in range(3):
        dist.all_reduce(torch.ones(1), group=pair)
    gone = weakref.ref(pair)
    dist.rec.forget(pair)
    del pair
    gc.collect()
    assert gone() is None
    dist.all_reduce(torch.ones(1))  # still recording
    assert dist.records()[-1]["group"] == "0"


def test_an_internal_error_disables_the_recorder_not_the_call(dist, capsys) -> None:
    t = torch.ones(2)
    dist.all_reduce(t)
    assert dist.all_reduce(t, group=["not", "a", "group"]) is None  # unhashable: the recorder fails
    assert "recorder disabled" in capsys.readouterr().err
    before = dist.rec.writer.count
    assert isinstance(dist.all_reduce(t, async_op=True), FakeWork)  # the job goes on, unrecorded
    assert dist.rec.writer.count == before
    if dist.rec.recording is not None:
        assert dist.rec.recording.ring is None


@pytest.mark.parametrize("path", PATHS)
def test_no_room_for_the_capture_disables_the_recorder_not_the_job(tmp_path, full_disk, capsys,
                                                                   path) -> None:
    d = FakeDist(tmp_path, path)
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "recorder disabled: rank 0 cannot create its capture" in err
    assert "No space left on device); free space there" in err and "Traceback" not in err
    t = torch.ones(2)
    assert d.all_reduce(t) is None and isinstance(d.all_reduce(t, async_op=True), FakeWork)
    assert d.world.seq == 2 and d.rec.writer is None  # the calls ran, unrecorded
    assert not list((tmp_path / path).glob("*" + fmt.CAPTURE_SUFFIX))
    marker = json.loads(next((tmp_path / path).glob("*" + fmt.UNRECORDED_SUFFIX)).read_text())
    assert marker["rank"] == 0 and marker["world_size"] == 2
    assert marker["why"].startswith("it cannot create its capture in")
    assert "No space" in marker["why"]


def test_an_out_directory_that_cannot_be_made_is_one_line_too(tmp_path, capsys) -> None:
    (tmp_path / "fast").write_text("a file where the directory should be")
    d = FakeDist(tmp_path, "fast")
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "rank 0 cannot create its capture" in err
    assert "internal error" not in err and "pass another --out" in err
    assert d.all_reduce(torch.ones(2)) is None and d.world.seq == 1 and d.rec.writer is None


def test_a_failing_call_is_recorded_as_failed(dist) -> None:
    t = torch.ones(2)

    class Boom(Exception):
        pass

    def fail(*args, **kwargs):
        raise Boom()

    spec = next(s for s in SPECS if s.name == "all_reduce")
    call = BoundCall(spec, dist._functions()["all_reduce"])
    call.op_id = dist.rec.writer.intern("all_reduce")
    recorded = wrap(dist.rec, call, fail)
    for _ in range(2):
        with pytest.raises(Boom):
            recorded(t)
    assert [r["state"] for r in dist.records()] == [EventState.FAILED] * 2
    assert dist.rec.stacks and all(not s for s in dist.rec.stacks.values())


def test_a_failing_call_raises_its_own_exception(dist) -> None:
    """The caller gets the very exception the function raised (a BaseException too), with the
    function's frame in its traceback, and the call is recorded as failed."""
    raised = [ValueError("bad shape"), KeyboardInterrupt()]

    def fail(tensor, op=None, group=None, async_op=False):
        raise raised[0]

    spec = next(s for s in SPECS if s.name == "all_reduce")
    call = BoundCall(spec, fail)
    call.op_id = dist.rec.writer.intern("all_reduce")
    recorded = wrap(dist.rec, call, fail)
    for _ in range(2):
        for err in list(raised):
            raised[0] = err
            with pytest.raises(type(err)) as info:
                recorded(torch.ones(2), group=None)
            assert info.value is err
            assert info.traceback[-1].name == "fail"
        raised.reverse()
    assert [r["state"] for r in dist.records()] == [EventState.FAILED] * 4
    assert dist.rec.enabled


def test_the_replacement_passes_for_the_function(dist, monkeypatch) -> None:
    """What code that inspects torch.distributed's functions sees: name, docs, signature,
    ``__wrapped__``, pickling by reference, binding as a method."""
    import inspect
    import pickle
    import types

    def all_reduce(tensor, op=None, group=None, async_op=False):
        """Reduces the tensor."""
        return "reduced"

    module = types.ModuleType("fake_c10d")
    all_reduce.__module__, all_reduce.__qualname__ = module.__name__, "all_reduce"
    spec = next(s for s in SPECS if s.name == "all_reduce")
    recorded = wrap(dist.rec, BoundCall(spec, all_reduce), all_reduce)
    module.all_reduce = recorded
    monkeypatch.setitem(sys.modules, module.__name__, module)
    assert recorded.__wrapped__ is all_reduce and recorded.__nccl_doctor__
    assert (recorded.__name__, recorded.__doc__) == ("all_reduce", "Reduces the tensor.")
    assert inspect.signature(recorded) == inspect.signature(all_reduce)
    assert pickle.loads(pickle.dumps(recorded)) is recorded
    assert "all_reduce" in repr(recorded)

    class Holder:
        method = recorded

    assert Holder.method is recorded
    bound = Holder().method
    assert bound.__func__ is recorded and bound(torch.ones(2)) == "reduced"
    assert recorded(torch.ones(2), async_op=False, group=None) == "reduced"
