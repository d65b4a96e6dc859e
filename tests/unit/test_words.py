"""Words: ranks named with a verb that agrees ("rank 0 waits", "ranks 0, 1 wait"), paths in their
short form, the GPU note only for a job that may have used CUDA, the live counters named."""

from __future__ import annotations

import io
from dataclasses import replace

import pytest

import nccl_doctor
from nccl_doctor import paths
from nccl_doctor.analysis import analyze
from nccl_doctor.analysis.what.hang import stall, stuck_peer
from nccl_doctor.analysis.calls.situation import Assessment, Situation
from nccl_doctor.capture.writer import CaptureWriter
from nccl_doctor.diagnosis import Diagnosis, Verdict
from nccl_doctor.gpu.readings import GpuTrace, RankGpu
from nccl_doctor.model import EventKind, EventState, ExitKind, GroupInfo, RankExit
from nccl_doctor.reporters.console import ConsoleReporter
from nccl_doctor.words import conjugate, pick, ranks_text, ranks_verb, verb


@pytest.fixture(autouse=True)
def _no_columns(monkeypatch) -> None:
    """The console reports below are read whole: no ``COLUMNS`` of the shell wraps them."""
    monkeypatch.delenv("COLUMNS", raising=False)


@pytest.mark.parametrize(("ranks", "text"), [
    ([3], "rank 3"), ([0, 2], "ranks 0, 2"), ([0, 1, 2, 5], "ranks 0-2, 5"),
    (list(range(637)) + list(range(638, 1024)), "ranks 0-636, 638-1023"),
])
def test_ranks_text(ranks, text) -> None:
    assert ranks_text(ranks) == text


@pytest.mark.parametrize(("singular", "plural"), [
    ("waits", "wait"), ("was", "were"), ("is", "are"), ("has", "have"), ("does", "do"),
    ("Was", "Were"), ("makes", "make"), ("passes", "pass"), ("reaches", "reach"),
    ("carries", "carry"), ("lies", "lie"), ("stays", "stay"), ("goes", "go"),
    # the past tense, and words that are no verb in the present, stay as they are
    ("exited", "exited"), ("raised", "raised"), ("left", "left"), ("its", "its"),
])
def test_verb_agrees_with_the_ranks(singular, plural) -> None:
    assert verb([0], singular) == singular and verb(1, singular) == singular
    assert verb([0, 1], singular) == plural and verb(2, singular) == plural


def test_the_sentences_with_ranks_as_their_subject() -> None:
    assert ranks_verb([0], "waits in all_reduce #3") == "rank 0 waits in all_reduce #3"
    assert ranks_verb([0, 1], "waits in all_reduce #3") == "ranks 0, 1 wait in all_reduce #3"
    assert ranks_verb([0, 1, 2], "was stopped by nccl-doctor") == \
        "ranks 0-2 were stopped by nccl-doctor"
    assert ranks_verb([4, 7], "has waited 30 s") == "ranks 4, 7 have waited 30 s"
    assert ranks_verb([4, 7], "exited cleanly") == "ranks 4, 7 exited cleanly"
    assert conjugate([1, 2], "is idle") == "are idle" and conjugate([1], "is idle") == "is idle"
    assert (pick([1], "its", "their"), pick([1, 2], "its", "their")) == ("its", "their")


def test_the_analysis_says_rank_0_waits_and_ranks_0_1_wait(tb) -> None:
    e = tb.event(3, state=tb.ENTERED)
    two = Assessment(Situation.WAITING_ON_PEERS, live=(0, 1, 2), waiting={0: e, 1: e},
                     awaited=(2,), stopped=(), cause=None)
    one = Assessment(Situation.WAITING_ON_PEERS, live=(0, 1, 2), waiting={0: e},
                     awaited=(1, 2), stopped=(), cause=None)
    hung = Diagnosis(verdict=Verdict.HANG, findings=(), ranks=(), world_size=3)
    assert stuck_peer(two, {2: "idle"}, hung, {}).title == \
        "ranks 0, 1 wait in all_reduce #3 (group 0); rank 2 never came"
    assert stuck_peer(one, {1: "idle", 2: "idle"}, hung, {}).title == \
        "rank 0 waits in all_reduce #3 (group 0); ranks 1, 2 never came"
    assert stall(two, "compute", 30).title == ("stall (compute): ranks 0, 1 have waited 30 s in "
                                               "all_reduce #3 (group 0) for rank 2, busy outside "
                                               "collectives")
    assert stall(one, "compute", 30).title.startswith("stall (compute): rank 0 has waited 30 s")


def test_ranks_that_ended_alike_are_named_with_their_verbs(tb) -> None:
    killed = RankExit(ExitKind.SIGNAL, signal="SIGKILL", time_ns=tb.T0 + 50 * tb.STEP)
    traces = tb.traceset(
        [tb.trace(0, tb.collectives(3, group_size=3, last_state=tb.ENTERED), tb.RUNNING,
                  world_size=3)]
        + [tb.trace(r, tb.collectives(2, group_size=3), killed, world_size=3) for r in (1, 2)],
        world_size=3)
    d = analyze(traces)
    root = d.root_cause
    assert root.title.startswith("ranks 1, 2 were killed by SIGKILL after all_reduce #2")
    assert root.title.endswith("while their peers still needed them")
    assert "Their peers went on to collective #3 of group 0, which they never entered." in \
        root.detail
    text = io.StringIO()
    ConsoleReporter().render(d, text)
    assert "ranks 1, 2: were killed by SIGKILL\n" in text.getvalue()
    assert "rank 0: was still running\n" in text.getvalue()


def test_consequences_agree_with_their_ranks(tb) -> None:
    d = analyze(tb.scenarios["rank_exited_early"]())
    assert "Afterwards (consequences, not causes): ranks 0, 2, 3 then raised RuntimeError" in \
        d.root_cause.detail
    items = d.root_cause.evidence.consequences
    assert items and all(i["detail"].startswith(f"rank {i['rank']} then raised") for i in items)


# -- short paths ---------------------------------------------------------------------------------

@pytest.mark.parametrize(("path", "short"), [
    ("/v/lib/python3.11/site-packages/trl/trainer/cpo_trainer.py", "trl/trainer/cpo_trainer.py"),
    ("/v/lib/python3.11/site-packages/trl/trainer/cpo_trainer.py:839",
     "trl/trainer/cpo_trainer.py:839"),
    ("/usr/lib/python3/dist-packages/accelerate/utils/ops.py", "accelerate/utils/ops.py"),
    ("/opt/py/lib/python3.12/threading.py", "threading.py"),
    ("/work/job/lib/python3.11/site-packages/torch/distributed/distributed_c10d.py:3252",
     "torch/distributed/distributed_c10d.py:3252"),  # a venv inside the working directory
    ("/work/job/train.py:16", "train.py:16"), ("/work/job/src/model.py", "src/model.py"),
    ("/elsewhere/train.py", "/elsewhere/train.py"), ("train.py", "train.py"),
    ("<frozen importlib._bootstrap>", "<frozen importlib._bootstrap>"), ("", ""),
])
def test_short_path(path, short) -> None:
    assert paths.short_path(path, "/work/job") == short


def test_the_api_holds_absolute_paths_and_short_path_links_them_to_the_report(
        tmp_path, monkeypatch) -> None:
    """``Job.calls`` keeps the absolute ``callsite``; ``nccl_doctor.short_path`` makes it what
    the console report prints."""
    job, site = tmp_path / "job", tmp_path / "venv/lib/python3.11/site-packages"
    job.mkdir()
    monkeypatch.chdir(job)
    for rank in (0, 1):
        w = CaptureWriter(job / f"rank{rank:05d}.node0.{10 + rank}.ndcap",
                          {"rank": rank, "world_size": 2, "host": "node0", "pid": 10 + rank})
        w.note("group", name="0", ranks=[0, 1], backend="gloo")
        op, grp, t4 = w.intern("all_reduce"), w.intern("0"), w.intern(f"float32[{4 + rank}]")
        user, lib = w.intern(str(job / "train.py")), w.intern(str(site / "trl/trainer/x.py"))
        fn = w.intern("step")
        idx = w.begin((0, 1, 1, 16, 1, op, grp, t4, 0, user, 20, fn, lib, 8, 0, -1, 2, 0,
                       int(EventKind.COLLECTIVE), 0, 0))
        w.end(idx, int(EventState.FAILED), 1)
    opened = nccl_doctor.open(job)
    calls = opened.calls
    assert set(calls["callsite"]) == {f"{job / 'train.py'}:20"}
    assert set(calls["api_callsite"]) == {f"{site / 'trl/trainer/x.py'}:8"}
    assert set(calls["callsite"].map(nccl_doctor.short_path)) == {"train.py:20"}
    assert set(calls["api_callsite"].map(nccl_doctor.short_path)) == {"trl/trainer/x.py:8"}
    out = io.StringIO()
    ConsoleReporter().render(opened.diagnose(), out)
    assert "train.py:20" in out.getvalue() and str(job) not in out.getvalue()
    assert "short_path" in nccl_doctor.__all__


# -- the GPU note --------------------------------------------------------------------------------

NO_DRIVER = "no NVIDIA driver on this host (libnvidia-ml.so.1 not found)"


@pytest.mark.parametrize(("backend", "placed", "noted"), [
    ("gloo", False, False), ("mpi", False, False),
    ("nccl", False, True), ("cpu:gloo,cuda:nccl", False, True), ("undefined", False, True),
    ("gloo", True, True),  # a rank the sampler placed on a GPU ran CUDA whatever its group
])
def test_the_gpu_note_only_for_a_job_that_may_have_used_cuda(tb, backend, placed, noted) -> None:
    base = tb.traceset([tb.trace(r, tb.collectives(2)) for r in (0, 1)])
    gpu = GpuTrace(available=False, reason=NO_DRIVER,
                   ranks={0: RankGpu(index=0, how="environment")} if placed else {})
    traces = replace(base, gpu=gpu, groups={
        n: GroupInfo(g.name, g.ranks, backend) for n, g in base.groups.items()})
    notes = [n for n in analyze(traces).notes if "GPU" in n]
    assert notes == ([f"GPUs not sampled: {NO_DRIVER}"] if noted else [])


# -- the live counters ---------------------------------------------------------------------------

def test_the_live_status_says_which_calls_it_counts() -> None:
    from nccl_doctor.reporters import status_line
    from nccl_doctor.status_view import COUNTED, LiveView, RankState, RankView

    view = LiveView((RankView(0, "h", 1, RankState.WAITING), RankView(1, "h", 0,
                                                                      RankState.AWAITED)),
                    "waiting_on_peers", "rank 0 waits in a collective on rank 1", 2.0, 4.0)
    assert COUNTED == "Python calls"
    assert "Python calls 0:1/waiting 1:0/awaited" in status_line.line(view)
    assert "Python calls 0:1 1:0" in status_line.bar(view).plain



def test_ranks_as_ranges_fold_every_run_of_two_or_more():
    from nccl_doctor.page_model import rank_ranges
    from nccl_doctor.words import ranges

    assert ranges([9, 0, 1, 2, 3, 5, 8, 3]) == "0-3, 5, 8-9"  # sorted, each rank once
    assert ranges([4]) == "4" and ranges([]) == ""
    assert rank_ranges((0, 1, 2, 3, 5, 8, 9)) == "0-3,5,8-9"  # the page's label
