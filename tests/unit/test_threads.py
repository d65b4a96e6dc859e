"""The thread that makes a rank's collectives, in its stacks: Ray Train runs the user's function
on a thread of its own while the main thread sits in Ray's loop; the summaries, STAT classes and
the "has it moved" signature must read the collective's thread, and name the main one too."""

from __future__ import annotations

from dataclasses import replace

from nccl_doctor.analysis.calls.threads import collective_thread, focused
from nccl_doctor.location import Location
from nccl_doctor.stacks import summary
from nccl_doctor.stacks.aggregate import classify
from nccl_doctor.stacks.rank_stack import RankStack, ThreadStack

RAY_LOOP = (Location("/v/site-packages/ray/_private/worker.py", 946, "main_loop"),
            Location("/v/site-packages/ray/_private/workers/default_worker.py", 330, "<module>"))
TRAINING = 140001


def train_thread(line: int, inside: bool = True) -> ThreadStack:
    frames = ((Location("/v/site-packages/torch/distributed/distributed_c10d.py", 2800,
                        "broadcast"),) if inside else ()) + (
        Location("/job/train_func.py", line, "train_func"),
        Location("/v/site-packages/ray/train/_internal/utils.py", 170, "run"),
        Location("/usr/lib/python3.11/threading.py", 1045, "_bootstrap_inner"))
    return ThreadStack(TRAINING, "TrainingThread", frames, True, False, False)


def ray_stack(rank: int, line: int, inside: bool = True) -> RankStack:
    main = ThreadStack(1, "MainThread", RAY_LOOP, False, False, True)
    return RankStack(rank, 100 + rank, "py-spy", (main, train_thread(line, inside)))


def test_the_recorded_thread_is_the_one_shown(tb) -> None:
    events = [replace(e, thread=TRAINING) for e in tb.collectives(3, last_state=tb.ENTERED)]
    traces = tb.traceset([tb.trace(0, events), tb.trace(1, events[:2])])
    assert collective_thread(traces.ranks[0]) == TRAINING  # inside its third call
    assert collective_thread(traces.ranks[1]) == TRAINING  # its last call
    stacks = focused({0: ray_stack(0, 12), 1: ray_stack(1, 20, inside=False)}, traces)
    assert stacks[1].thread.name == "TrainingThread"  # though outside any collective
    text = summary.stack_summary(stacks[1])
    assert text.startswith("/job/train_func.py:20 in train_func [py-spy] on thread "
                           "'TrainingThread'; main thread at ")
    assert "main_loop" in text
    classes = classify(stacks)
    assert sorted(c.ranks for c in classes) == [(0,), (1,)]
    assert all(c.frames[-1].function in ("broadcast", "train_func") for c in classes)
    assert stacks[0].signature() != ray_stack(0, 12).main.root_first  # not Ray's loop
    assert stacks[0].signature()[-1][1] == "broadcast"


def test_without_a_capture_the_thread_inside_torch_distributed_is_taken() -> None:
    stack = ray_stack(0, 12)
    assert stack.focus is None and stack.thread.name == "TrainingThread"
    idle = ray_stack(0, 12, inside=False)  # nothing says which: the main thread, as before
    assert idle.thread is idle.main
    plain = RankStack(0, 1, "agent", (ThreadStack(1, "MainThread", train_thread(5).frames,
                                                  True, True, True),))
    assert summary.stack_summary(plain) == "/job/train_func.py:5 in train_func [agent]"


def test_a_focus_thread_absent_from_the_sample_falls_back(tb) -> None:
    stack = replace(ray_stack(0, 12), focus=999)
    assert stack.thread.name == "TrainingThread"
    assert focused({0: stack}, None)[0] is stack


def test_an_installed_file_belongs_to_its_top_level_package() -> None:
    """ray/train/torch/config.py is Ray's (its destroy_process_group is a line worth naming),
    not torch's; a source checkout of torch is torch's by its directory; an installed file is
    library code, whatever the library."""
    from nccl_doctor import paths

    site = "/v/lib/python3.11/site-packages/"
    assert not paths.is_internal_file(site + "ray/train/torch/config.py")
    assert paths.is_library_file(site + "ray/train/torch/config.py")
    assert paths.is_internal_file(site + "torch/distributed/distributed_c10d.py")
    assert paths.is_library_file(site + "trl/trainer/cpo_trainer.py")
    assert not paths.is_internal_file(site + "trl/trainer/cpo_trainer.py")
    assert paths.is_internal_file("/opt/pytorch/torch/distributed/distributed_c10d.py")
    assert paths.package_of(site + "trl/trainer/cpo_trainer.py") == "trl"
    assert paths.package_of("/job/train.py") is None
    assert paths.is_library_file(site + "lightning/pytorch/strategies/ddp.py")
    assert not paths.is_library_file("/job/train.py")
