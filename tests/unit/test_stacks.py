"""The stack model, its parser, and the STAT-style classes (synthetic and recorded data, no I/O)."""

from __future__ import annotations

import json
import sys
import threading

import pytest

from nccl_doctor.location import Location
from nccl_doctor.stacks.aggregate import (
    StackClass, classify, common_prefix, divergence, format_classes, rank_list,
)
from nccl_doctor.stacks.rank_stack import RankStack, ThreadStack, parse_stack_json

# Recorded once with py-spy 0.4.3 on CPython 3.11.7 (Linux x86_64) and pasted verbatim:
#   py-spy dump --json --nonblocking --pid PID
# PYSPY_TWO_THREADS is this program, sampled while the main thread sleeps (pid 13405):
#   import threading, time
#   def waiting_in_barrier():
#       time.sleep(1000)
#   def worker():
#       while True:
#           time.sleep(0.5)
#   threading.Thread(target=worker, name="heartbeat", daemon=True).start()
#   waiting_in_barrier()
# PYSPY_BUSY_NO_THREADING is a busy loop that never imports threading (pid 13459), which is why
# py-spy reports "thread_name": null there; the main thread is found by os_thread_id == pid:
#   def computing():
#       x = 0
#       while True:
#           x += 1
#   computing()
PYSPY_TWO_THREADS = """\
[
  {
    "pid": 13405,
    "thread_id": 139823026816704,
    "thread_name": "heartbeat",
    "os_thread_id": 13407,
    "active": false,
    "owns_gil": false,
    "frames": [
      {
        "name": "worker",
        "filename": "/tmp/spyexp/target.py",
        "module": null,
        "short_filename": "target.py",
        "line": 6,
        "locals": null,
        "is_entry": true,
        "is_shim_entry": false
      },
      {
        "name": "Thread.run",
        "filename": "/root/.pyenv/versions/3.11.7/lib/python3.11/threading.py",
        "module": null,
        "short_filename": "threading.py",
        "line": 982,
        "locals": null,
        "is_entry": false,
        "is_shim_entry": false
      },
      {
        "name": "Thread._bootstrap_inner",
        "filename": "/root/.pyenv/versions/3.11.7/lib/python3.11/threading.py",
        "module": null,
        "short_filename": "threading.py",
        "line": 1045,
        "locals": null,
        "is_entry": false,
        "is_shim_entry": false
      },
      {
        "name": "Thread._bootstrap",
        "filename": "/root/.pyenv/versions/3.11.7/lib/python3.11/threading.py",
        "module": null,
        "short_filename": "threading.py",
        "line": 1002,
        "locals": null,
        "is_entry": true,
        "is_shim_entry": true
      }
    ],
    "process_info": null
  },
  {
    "pid": 13405,
    "thread_id": 139823039753088,
    "thread_name": "MainThread",
    "os_thread_id": 13405,
    "active": false,
    "owns_gil": false,
    "frames": [
      {
        "name": "waiting_in_barrier",
        "filename": "/tmp/spyexp/target.py",
        "module": null,
        "short_filename": "target.py",
        "line": 3,
        "locals": null,
        "is_entry": false,
        "is_shim_entry": false
      },
      {
        "name": "<module>",
        "filename": "/tmp/spyexp/target.py",
        "module": null,
        "short_filename": "target.py",
        "line": 8,
        "locals": null,
        "is_entry": true,
        "is_shim_entry": true
      }
    ],
    "process_info": null
  }
]
"""

PYSPY_BUSY_NO_THREADING = """\
[
  {
    "pid": 13459,
    "thread_id": 140378762185600,
    "thread_name": null,
    "os_thread_id": 13459,
    "active": true,
    "owns_gil": true,
    "frames": [
      {
        "name": "computing",
        "filename": "/tmp/spyexp/busy.py",
        "module": null,
        "short_filename": "busy.py",
        "line": 4,
        "locals": null,
        "is_entry": false,
        "is_shim_entry": false
      },
      {
        "name": "<module>",
        "filename": "/tmp/spyexp/busy.py",
        "module": null,
        "short_filename": "busy.py",
        "line": 5,
        "locals": null,
        "is_entry": true,
        "is_shim_entry": true
      }
    ],
    "process_info": null
  }
]
"""


# The in-rank agent's shape: the same keys py-spy uses, plus an explicit main-thread flag.
AGENT_SAMPLE = [
    {"thread_id": 11, "thread_name": "nccl-doctor-agent", "frames": [
        {"name": "run", "filename": "/site/nccl_doctor/agent.py", "line": 30},
    ]},
    {"thread_id": 7, "thread_name": "MainThread", "is_main": True, "frames": [
        {"name": "all_reduce", "filename": "/site/torch/distributed/distributed_c10d.py",
         "line": 2501},
        {"name": "step", "filename": "/job/train.py", "line": 41},
        {"name": "<module>", "filename": "/job/train.py", "line": 80},
    ]},
]


# --- parsing -------------------------------------------------------------------------------------

def test_parse_recorded_pyspy_dump_with_two_threads():
    stack = parse_stack_json(PYSPY_TWO_THREADS, rank=3, pid=13405, source="py-spy", taken_at=12.5)
    assert (stack.rank, stack.pid, stack.source, stack.taken_at) == (3, 13405, "py-spy", 12.5)
    assert stack.error is None
    assert [t.name for t in stack.threads] == ["heartbeat", "MainThread"]
    main = stack.main
    assert main is stack.threads[1] and main.is_main
    assert not stack.threads[0].is_main
    assert main.thread_id == 139823039753088
    assert main.frames == (
        Location("/tmp/spyexp/target.py", 3, "waiting_in_barrier"),
        Location("/tmp/spyexp/target.py", 8, "<module>"),
    )
    assert main.frames[0].where == "/tmp/spyexp/target.py:3"
    assert (main.active, main.owns_gil) == (False, False)
    heartbeat = stack.threads[0]
    assert [f.function for f in heartbeat.frames] == [
        "worker", "Thread.run", "Thread._bootstrap_inner", "Thread._bootstrap",
    ]
    assert heartbeat.root_first[0].function == "Thread._bootstrap"


def test_parse_recorded_busy_dump_finds_main_by_os_thread_id():
    stack = parse_stack_json(PYSPY_BUSY_NO_THREADING, rank=0, pid=13459, source="py-spy",
                             taken_at=0.0)
    (thread,) = stack.threads
    assert thread.name is None
    assert thread.is_main and stack.main is thread
    assert (thread.active, thread.owns_gil) == (True, True)
    assert [f.function for f in thread.frames] == ["computing", "<module>"]


def test_parse_accepts_bytes_and_decoded_lists_alike():
    from_text = parse_stack_json(PYSPY_TWO_THREADS.encode(), rank=0, pid=13405, source="py-spy",
                                 taken_at=1.0)
    from_obj = parse_stack_json(json.loads(PYSPY_TWO_THREADS), rank=0, pid=13405, source="py-spy",
                                taken_at=1.0)
    assert from_text == from_obj


def test_main_thread_falls_back_to_the_name_when_pid_does_not_match():
    # e.g. a rank inside a container whose pid namespace differs from ours
    stack = parse_stack_json(PYSPY_TWO_THREADS, rank=0, pid=1, source="py-spy", taken_at=0.0)
    assert stack.main is not None and stack.main.name == "MainThread"


def test_without_any_main_marker_main_is_the_first_thread():
    data = json.loads(PYSPY_TWO_THREADS)
    for thread in data:
        thread["thread_name"] = "worker"
    stack = parse_stack_json(data, rank=0, pid=1, source="py-spy", taken_at=0.0)
    assert not any(t.is_main for t in stack.threads)
    assert stack.main is stack.threads[0]


def test_parse_agent_shape():
    stack = parse_stack_json(AGENT_SAMPLE, rank=1, pid=4242, source="agent", taken_at=3.0)
    assert stack.source == "agent"
    main = stack.main
    assert main is not None and main.thread_id == 7 and main.is_main
    assert (main.active, main.owns_gil) == (None, None)  # the agent does not know
    assert main.root_first[0] == Location("/job/train.py", 80, "<module>")
    assert main.frames[0].function == "all_reduce"
    assert [t.is_main for t in stack.threads] == [False, True]


def test_parse_agent_shape_built_from_real_frames():
    # What an agent thread would build from sys._current_frames(), innermost first.
    me = threading.get_ident()
    threads = []
    for tid, frame in sys._current_frames().items():
        frames = []
        while frame is not None:
            frames.append({"name": frame.f_code.co_name, "filename": frame.f_code.co_filename,
                           "line": frame.f_lineno})
            frame = frame.f_back
        threads.append({"thread_id": tid, "thread_name": None, "frames": frames,
                        "is_main": tid == threading.main_thread().ident})
    stack = parse_stack_json(json.dumps(threads), rank=0, pid=1, source="agent", taken_at=0.0)
    main = stack.main
    assert main is not None and main.thread_id == threading.main_thread().ident == me
    assert main.frames[0].function == "test_parse_agent_shape_built_from_real_frames"
    assert main.frames[0].path == __file__


def test_a_frame_with_unknown_line_is_kept_as_line_zero():
    data = [{"thread_id": 1, "frames": [{"name": "f", "filename": "x.py", "line": None}]}]
    stack = parse_stack_json(data, rank=0, pid=1, source="faulthandler", taken_at=0.0)
    assert stack.threads[0].frames == (Location("x.py", 0, "f"),)


@pytest.mark.parametrize(
    ("data", "message"),
    [
        ("not json at all", "not JSON"),
        ('{"thread_id": 1}', "expected a list of threads"),
        ("[1, 2]", "expected an object"),
        ('[{"thread_name": "MainThread", "frames": []}]', "no integer thread_id"),
        ('[{"thread_id": true, "frames": []}]', "no integer thread_id"),
        ('[{"thread_id": 1}]', "no frames list"),
        ('[{"thread_id": 1, "frames": {"name": "f"}}]', "no frames list"),
        ('[{"thread_id": 1, "frames": ["f"]}]', "expected an object"),
        ('[{"thread_id": 1, "frames": [{"name": "f", "line": 3}]}]', "string name and filename"),
        ('[{"thread_id": 1, "frames": [{"name": "f", "filename": "x", "line": "3"}]}]',
         "non-integer line"),
        ('[{"thread_id": 1, "thread_name": 5, "frames": []}]', "thread_name"),
        ('[{"thread_id": 1, "active": "yes", "frames": []}]', "active"),
        (b"\xff\xfe", "not JSON"),
    ],
)
def test_malformed_input_is_a_one_line_value_error(data, message):
    with pytest.raises(ValueError) as info:
        parse_stack_json(data, rank=2, pid=1, source="py-spy", taken_at=0.0)
    text = str(info.value)
    assert message in text
    assert "\n" not in text and "rank 2" in text


def test_unknown_source_is_refused():
    with pytest.raises(ValueError, match="unknown stack source 'gdb'"):
        parse_stack_json("[]", rank=0, pid=1, source="gdb", taken_at=0.0)


def test_an_empty_dump_has_no_main_thread():
    stack = parse_stack_json("[]", rank=0, pid=1, source="py-spy", taken_at=0.0)
    assert stack.threads == () and stack.main is None and stack.signature() == ()


def test_signature_is_the_main_stack_root_first_and_detects_movement():
    before = parse_stack_json(PYSPY_TWO_THREADS, rank=0, pid=13405, source="py-spy", taken_at=1.0)
    again = parse_stack_json(PYSPY_TWO_THREADS, rank=0, pid=13405, source="py-spy", taken_at=9.0)
    assert before.signature() == (
        ("/tmp/spyexp/target.py", "<module>", 8),
        ("/tmp/spyexp/target.py", "waiting_in_barrier", 3),
    )
    assert before.signature() == again.signature()  # same place, different time: not moved
    moved = json.loads(PYSPY_TWO_THREADS)
    moved[1]["frames"][0]["line"] = 4
    after = parse_stack_json(moved, rank=0, pid=13405, source="py-spy", taken_at=9.0)
    assert after.signature() != before.signature()


def test_to_json_is_plain_data():
    stack = parse_stack_json(AGENT_SAMPLE, rank=1, pid=4242, source="agent", taken_at=3.0)
    data = stack.to_json()
    assert json.loads(json.dumps(data)) == data
    assert data["rank"] == 1 and data["source"] == "agent" and data["error"] is None
    main = [t for t in data["threads"] if t["is_main"]]
    assert main[0]["frames"][1] == {"function": "step", "path": "/job/train.py", "line": 41}
    failed = RankStack(2, 99, "py-spy", (), "process 99 is gone", 4.0).to_json()
    assert failed == {"rank": 2, "pid": 99, "source": "py-spy", "taken_at": 4.0,
                      "error": "process 99 is gone", "threads": []}


def test_model_is_frozen():
    frame = Location("x.py", 1, "f")
    with pytest.raises(AttributeError):
        frame.line = 2  # type: ignore[misc]


# --- classes -------------------------------------------------------------------------------------

MODULE = Location("/job/train.py", 80, "<module>")
MAIN = Location("/job/train.py", 60, "main")
STEP = Location("/job/train.py", 41, "step")
STEP_LOSS = Location("/job/train.py", 45, "step")
ALL_REDUCE = Location("/site/torch/distributed/distributed_c10d.py", 2501, "all_reduce")
BARRIER = Location("/site/torch/distributed/distributed_c10d.py", 4100, "barrier")
LOSS = Location("/job/loss.py", 12, "compute_loss")


def rank_stack(rank: int, *root_first: Location, error: str | None = None) -> RankStack:
    """A py-spy sample whose main thread holds ``root_first`` (given outermost first)."""
    if error is not None:
        return RankStack(rank, 1000 + rank, "py-spy", (), error, 0.0)
    helper = ThreadStack(2, "pin_memory", (Location("/py/threading.py", 320, "wait"),), False, False,
                         False)
    main = ThreadStack(1, "MainThread", tuple(reversed(root_first)), True, True, True)
    return RankStack(rank, 1000 + rank, "py-spy", (helper, main), None, 0.0)


def four_ranks_one_odd() -> dict[int, RankStack]:
    return {
        0: rank_stack(0, MODULE, MAIN, STEP, ALL_REDUCE),
        1: rank_stack(1, MODULE, MAIN, STEP_LOSS, LOSS),
        2: rank_stack(2, MODULE, MAIN, STEP, ALL_REDUCE),
        3: rank_stack(3, MODULE, MAIN, STEP, ALL_REDUCE),
    }


def test_three_against_one_makes_the_one_odd():
    classes = classify(four_ranks_one_odd())
    assert classes == [
        StackClass((MODULE, MAIN, STEP, ALL_REDUCE), (0, 2, 3), odd=False),
        StackClass((MODULE, MAIN, STEP_LOSS, LOSS), (1,), odd=True),
    ]


def test_classes_use_the_main_thread_only():
    # rank_stack puts a helper thread first; a helper that differs must not split the class
    stacks = four_ranks_one_odd()
    other = ThreadStack(9, "other", (LOSS,), False, False, False)
    stacks[0] = RankStack(0, 1000, "py-spy", (other, *stacks[0].threads), None, 0.0)
    assert classify(stacks)[0].ranks == (0, 2, 3)


def test_a_tie_marks_no_class_odd():
    stacks = {
        0: rank_stack(0, MODULE, STEP, ALL_REDUCE),
        1: rank_stack(1, MODULE, STEP, BARRIER),
        2: rank_stack(2, MODULE, STEP, ALL_REDUCE),
        3: rank_stack(3, MODULE, STEP, BARRIER),
    }
    classes = classify(stacks)
    assert [c.ranks for c in classes] == [(0, 2), (1, 3)]  # equal sizes: lowest rank first
    assert not any(c.odd for c in classes)


def test_every_class_smaller_than_the_largest_is_odd():
    stacks = {r: rank_stack(r, MODULE, STEP, ALL_REDUCE) for r in range(4)}
    stacks[4] = rank_stack(4, MODULE, STEP, BARRIER)
    stacks[5] = rank_stack(5, MODULE, STEP_LOSS, LOSS)
    classes = classify(stacks)
    assert [(c.ranks, c.odd) for c in classes] == [((0, 1, 2, 3), False), ((4,), True),
                                                    ((5,), True)]


def test_a_single_class_is_not_odd_and_no_input_gives_no_class():
    stacks = {r: rank_stack(r, MODULE, STEP, ALL_REDUCE) for r in range(3)}
    assert classify(stacks) == [StackClass((MODULE, STEP, ALL_REDUCE), (0, 1, 2), odd=False)]
    assert classify({}) == []
    assert common_prefix([]) == () and divergence([]) == [] and format_classes([]) == []


def test_ranks_without_a_stack_form_their_own_class():
    stacks = four_ranks_one_odd()
    stacks[4] = rank_stack(4, error="process 1004 is gone")
    stacks[5] = RankStack(5, 1005, "py-spy", (), None, 0.0)  # sampled, but no Python thread yet
    classes = classify(stacks)
    assert [c.ranks for c in classes] == [(0, 2, 3), (4, 5), (1,)]
    missing = classes[1]
    assert missing.missing and missing.frames == () and missing.odd
    assert not classes[0].missing and not classes[0].odd
    assert common_prefix(classes) == (MODULE, MAIN)  # the missing class does not empty the prefix


def test_depth_merges_classes_that_differ_below_it():
    stacks = four_ranks_one_odd()
    assert len(classify(stacks, depth=3)) == 2  # <module>, main, step@41 vs step@45
    (merged,) = classify(stacks, depth=2)
    assert merged == StackClass((MODULE, MAIN), (0, 1, 2, 3), odd=False)
    assert len(classify(stacks, depth=100)) == 2
    with pytest.raises(ValueError, match="depth"):
        classify(stacks, depth=0)


def test_common_prefix_and_divergence_name_what_sets_each_class_apart():
    classes = classify(four_ranks_one_odd())
    assert common_prefix(classes) == (MODULE, MAIN)
    assert divergence(classes) == [
        (classes[0], (STEP, ALL_REDUCE)),
        (classes[1], (STEP_LOSS, LOSS)),
    ]


def test_divergence_when_one_stack_is_a_prefix_of_another():
    stacks = {0: rank_stack(0, MODULE, MAIN, STEP), 1: rank_stack(1, MODULE, MAIN),
              2: rank_stack(2, MODULE, MAIN, STEP)}
    classes = classify(stacks)
    assert common_prefix(classes) == (MODULE, MAIN)
    assert divergence(classes) == [(classes[0], (STEP,)), (classes[1], ())]
    assert format_classes(classes)[-1] == (
        "rank 1 (1): ... -> train.py:60 main (end of the shared stack)  <- odd one out"
    )


def test_format_classes_shows_the_shared_stack_once_then_each_distinct_tail():
    lines = format_classes(classify(four_ranks_one_odd()))
    assert lines == [
        "all ranks: train.py:80 <module> -> train.py:60 main",
        "ranks 0, 2, 3 (3): ... -> train.py:41 step -> distributed_c10d.py:2501 all_reduce",
        "rank 1 (1): ... -> train.py:45 step -> loss.py:12 compute_loss  <- odd one out",
    ]


def test_format_classes_keeps_only_the_innermost_tail_frames():
    deep = [Location("/job/deep.py", i, f"f{i}") for i in range(10)]
    stacks = {0: rank_stack(0, MODULE, *deep), 1: rank_stack(1, MODULE, STEP),
              2: rank_stack(2, MODULE, *deep)}
    lines = format_classes(classify(stacks), tail=3)
    assert lines[0] == "all ranks: train.py:80 <module>"
    assert lines[1] == "ranks 0, 2 (2): ... -> deep.py:7 f7 -> deep.py:8 f8 -> deep.py:9 f9"
    assert lines[2] == "rank 1 (1): ... -> train.py:41 step  <- odd one out"
    with pytest.raises(ValueError, match="tail"):
        format_classes([], tail=0)


def test_format_a_single_class_and_a_missing_class():
    stacks = {r: rank_stack(r, MODULE, MAIN, STEP, ALL_REDUCE) for r in range(8)}
    stacks[8] = rank_stack(8, error="py-spy timed out after 5s on pid 1008")
    lines = format_classes(classify(stacks), tail=2)
    assert lines == [
        "ranks 0-7 (8): ... -> train.py:41 step -> distributed_c10d.py:2501 all_reduce",
        "rank 8 (1): no stack  <- odd one out",
    ]
    whole = format_classes(classify({0: rank_stack(0, MODULE, STEP)}))
    assert whole == ["rank 0 (1): train.py:80 <module> -> train.py:41 step"]


def test_rank_list_compresses_runs_of_three_or_more():
    assert rank_list([3, 0, 2]) == "0, 2, 3"
    assert rank_list(range(128)) == "0-127"
    assert rank_list([0, 1, 2, 3, 5, 7, 8, 9, 10]) == "0-3, 5, 7-10"
    assert rank_list([]) == ""


def test_straggler_samples_file_is_bounded_and_read_defensively(tmp_path):
    from nccl_doctor.stacks.samples import (
        MAX_PER_RANK, STRAGGLERS_JSONL, SampleLog, StackSample, read_samples,
    )

    assert read_samples(tmp_path) == ((), "")
    log = SampleLog(tmp_path)
    for k in range(MAX_PER_RANK + 5):
        log.add(StackSample(float(k), 1, ("train.py:3 in f",), (0,), "py-spy"))
    log.add(StackSample(1.0, 2, ("train.py:9 in g",), (0, 1), "agent"))
    with open(tmp_path / STRAGGLERS_JSONL, "a") as f:
        f.write('junk\n{"t": 1, "rank": -1, "frames": [], "waiting": []}\n'
                '{"t": 1, "rank": 3, "frames": [7], "waiting": []}\n[]\n')
    got, damaged = read_samples(tmp_path)
    n = MAX_PER_RANK + 1 + 4  # the samples kept, then the four lines appended
    assert damaged.startswith(f"1 of {n} lines skipped as damaged (the first, line "
                              f"{MAX_PER_RANK + 2}: invalid JSON at line 1 column 1")
    assert [s.rank for s in got].count(1) == MAX_PER_RANK
    assert got[-1] == StackSample(1.0, 2, ("train.py:9 in g",), (0, 1), "agent")
