"""PyTorch Flight Recorder dumps read on their own (``nccl-doctor replay DIR``): the real H100
NCCL pickles and the gloo JSON dumps recorded here, and every way a dump can be bad."""

from __future__ import annotations

import json
import os
import pickle
import re
import shutil
from pathlib import Path

import pytest

from nccl_doctor.analysis import analyze
from nccl_doctor.analysis.calls.loaded import load
from nccl_doctor.capture import fr_dump
from nccl_doctor.diagnosis import FindingKind, Verdict
from nccl_doctor.errors import CorruptCapture, NotACapture, RefusedInput, UnsupportedVersion

FIXTURES = Path(__file__).parent.parent / "fixtures" / "fr_dumps"
H100 = {"shape_mismatch": FIXTURES / "h100_nccl_shape_mismatch",
        "skip_broadcast": FIXTURES / "h100_nccl_skip_broadcast"}


def torchfrtrace_culprit(directory: Path) -> int:
    """The culprit PyTorch's own analyzer named in its saved output."""
    m = re.search(r"Culprit rank (\d+)", (directory / "torchfrtrace.txt").read_text())
    assert m, "torchfrtrace named no culprit"
    return int(m.group(1))


def diagnose(path: Path, fr: Path | None = None):
    return analyze(load(path, fr=fr), annotators=())


# -- the real NCCL dumps from an H100 (pickles) ---------------------------------------------------

def test_h100_shape_mismatch_names_torchfrtraces_culprit_and_the_user_line():
    d = diagnose(H100["shape_mismatch"])
    root = d.root_cause
    assert d.verdict is Verdict.HANG
    assert root.kind is FindingKind.COLLECTIVE_MISMATCH and root.evidence["aspect"] == "shape"
    assert root.ranks == (torchfrtrace_culprit(H100["shape_mismatch"]),)
    assert (root.group, root.seq, root.op) == ("0", 5, "all_gather")
    # the user's frame, not torch's distributed_c10d.py or c10d_logger.py
    assert root.callsite == "/srv/jobs/rlhf/gpu/scen/nccl_shape_mismatch.py:15"
    values = {s["value"] for s in root.evidence["sides"]}
    assert values == {"float32[2,7,16]", "float32[2,10,16]"}
    assert {s["state"] for s in root.evidence["sides"]} == {"returned", "entered"}


def test_h100_skipped_broadcast_names_the_skipper_and_both_lines():
    d = diagnose(H100["skip_broadcast"])
    root = d.root_cause
    assert root.kind is FindingKind.COLLECTIVE_MISMATCH and root.evidence["aspect"] == "op"
    assert root.ranks == (torchfrtrace_culprit(H100["skip_broadcast"]),) == (1,)
    assert (root.group, root.seq) == ("0", 4)
    sides = {s["op"]: s["callsite"] for s in root.evidence["sides"]}
    assert sides == {"broadcast": "/srv/jobs/rlhf/gpu/scen/nccl_skip_broadcast.py:14",
                     "all_reduce": "/srv/jobs/rlhf/gpu/scen/nccl_skip_broadcast.py:20"}
    assert "rank 1 skipped broadcast" in root.detail


def test_any_prefix_and_the_rank_from_the_name_or_the_dump(tmp_path):
    src = H100["skip_broadcast"]
    shutil.copy(src / "rank_0", tmp_path / "nccl_trace_rank_0.pkl")
    dump = pickle.loads((src / "rank_1").read_bytes())  # trusted: our own fixture
    dump["rank"] = 1
    (tmp_path / "dump-from-host-b").write_bytes(pickle.dumps(dump))  # no rank in the name
    d = diagnose(tmp_path)
    assert d.root_cause.ranks == (1,) and d.root_cause.seq == 4


def test_missing_ranks_are_named(tmp_path):
    shutil.copy(H100["shape_mismatch"] / "rank_0", tmp_path / "rank_0")
    d = diagnose(tmp_path)
    assert any("no Flight Recorder dump for rank(s) 1" in n for n in d.notes), d.notes
    assert not any(f.kind is FindingKind.COLLECTIVE_MISMATCH for f in d.findings)


# -- bad input: one line each, never a traceback, never code run -----------------------------------

class _Payload:
    def __init__(self, target: Path) -> None:
        self.target = target

    def __reduce__(self):
        return (os.system, (f"touch {self.target}",))


def test_a_pickle_that_asks_for_code_is_refused_and_nothing_runs(tmp_path):
    target = tmp_path / "pwned"
    dumps = tmp_path / "dumps"
    dumps.mkdir()
    evil = {"version": "2.10", "entries": [], "pg_config": {}, "x": _Payload(target)}
    (dumps / "rank_0").write_bytes(pickle.dumps(evil))
    shutil.copy(H100["skip_broadcast"] / "rank_1", dumps / "rank_1")
    with pytest.raises(RefusedInput, match=r"rank_0 is a pickle that asks for posix\.system"):
        load(dumps)
    assert not target.exists()
    # a sanity check of the payload itself: the plain unpickler would have run it
    pickle.loads((dumps / "rank_0").read_bytes())
    assert target.exists()


def test_a_truncated_pickle_is_corrupt(tmp_path):
    data = (H100["skip_broadcast"] / "rank_0").read_bytes()
    (tmp_path / "rank_0").write_bytes(data[: len(data) // 2])
    with pytest.raises(CorruptCapture, match="truncated or damaged pickle"):
        load(tmp_path)


@pytest.mark.parametrize("content, error, words", [
    ({"version": "2.10", "entries": "all_reduce"}, CorruptCapture, "must be a list"),
    ({"version": 2.1, "entries": []}, CorruptCapture, "version of the wrong type"),
    ([1, 2, 3], NotACapture, "not a Flight Recorder dump"),
    ({"version": "3.0", "entries": []}, UnsupportedVersion, "format 3.0"),
    ({"version": "2.10", "other": 1}, NotACapture, "no \"entries\""),
])
def test_wrong_types_and_future_versions(tmp_path, content, error, words):
    (tmp_path / "rank_0").write_bytes(pickle.dumps(content))
    with pytest.raises(error, match=re.escape(words)):
        fr_dump.load_dumps(tmp_path)
    (tmp_path / "rank_0").unlink()
    (tmp_path / "rank_0.json").write_text(json.dumps(content))
    with pytest.raises(error, match=re.escape(words)):
        fr_dump.load_dumps(tmp_path)


def test_a_newer_minor_version_is_read_with_a_note(tmp_path):
    for rank in (0, 1):
        dump = pickle.loads((H100["skip_broadcast"] / f"rank_{rank}").read_bytes())
        dump["version"] = "2.99"
        (tmp_path / f"rank_{rank}.json").write_text(json.dumps(dump))
    d = diagnose(tmp_path)
    assert d.root_cause.ranks == (1,)
    assert any("2.99 is newer" in n for n in d.notes)


def test_one_damaged_dump_among_good_ones_is_skipped_with_a_note(tmp_path):
    shutil.copy(H100["skip_broadcast"] / "rank_0", tmp_path / "rank_0")
    (tmp_path / "rank_1").write_bytes(b"\x80\x04garbage")
    d = diagnose(tmp_path)
    assert any("rank_1 skipped" in n for n in d.notes)
    # its name says whose it was: rank 1's dump is damaged - unseen, never missing or blamed
    assert "rank 1: its Flight Recorder dump rank_1 is damaged: what it did is not seen" in \
        "\n".join(d.notes)
    assert d.partial == "the capture of rank 1 is damaged"
    assert not any(1 in f.ranks for f in d.findings)


# -- JSON and pickle dumps of real gloo jobs recorded here (tests/fixtures/fr_dumps/record_gloo.py)

GLOO = {  # scenario -> the finding kind; the culprit is torchfrtrace's (its saved output)
    "gloo_skip_broadcast": FindingKind.COLLECTIVE_MISMATCH,
    "gloo_shape_mismatch": FindingKind.COLLECTIVE_MISMATCH,
    "gloo_ddp_uneven": FindingKind.COLLECTIVE_MISMATCH,
    "gloo_missing_rank2_of_3": FindingKind.MISSING_COLLECTIVE,
}


def torchfrtrace_blames(directory: Path) -> tuple[int, ...]:
    text = (directory / "torchfrtrace.txt").read_text()
    culprit = re.search(r"Culprit rank (\d+)", text)
    if culprit:
        return (int(culprit.group(1)),)
    missing = re.search(r"missing ranks: \{([\d, ]+)\}", text)
    assert missing, "torchfrtrace blamed no rank"
    return tuple(int(r) for r in missing.group(1).split(","))


@pytest.mark.parametrize("scenario", sorted(GLOO))
@pytest.mark.parametrize("form", ["json", "pickle"])
def test_gloo_dumps_agree_with_torchfrtrace(scenario, form):
    directory = FIXTURES / scenario
    d = diagnose(directory if form == "json" else directory / "pickle")
    root = d.root_cause
    assert root is not None and root.kind is GLOO[scenario], d.findings
    assert root.ranks == torchfrtrace_blames(directory)
    if form == "pickle":  # torch's pickles carry the Python stack: the user's line
        assert "record_gloo.py:" in root.callsite and "distributed_c10d" not in root.callsite
    else:  # its JSON dumps carry none: no callsite, never a placeholder; the detail says so
        assert root.callsite is None and root.entry_callsite is None, root
        assert "no stack of it was recorded" in root.detail and "<" not in root.detail, root.detail


# -- many dumps: read by worker processes, cut to the window the analysis needs -------------------

def _job(tmp_path: Path, ranks: int, skipper: int) -> Path:
    """``ranks`` copies of the H100 skip-broadcast job's rank 0 dump, one of which (``skipper``)
    is rank 1's: it skipped the broadcast."""
    out = tmp_path / "dumps"
    out.mkdir()
    good = (H100["skip_broadcast"] / "rank_0").read_bytes()
    bad = (H100["skip_broadcast"] / "rank_1").read_bytes()
    for r in range(ranks):
        dump = pickle.loads(bad if r == skipper else good)  # trusted: our own fixture
        dump["pg_config"]["0"]["ranks"] = json.dumps(list(range(ranks)))
        (out / f"rank_{r}").write_bytes(pickle.dumps(dump))
    return out


@pytest.mark.parametrize("workers", [1, 2])
def test_many_dumps_in_workers_give_the_serial_diagnosis(tmp_path, monkeypatch, workers):
    from nccl_doctor.capture import fr_parallel

    monkeypatch.setattr(fr_parallel, "MIN_FILES", 2)
    dumps = fr_parallel.load_window(_job(tmp_path, 6, skipper=4), workers=workers)
    assert sorted(dumps.by_rank) == list(range(6)) and dumps.compared == 6 * 7 - 1
    d = analyze(fr_dump.traces_from_dumps(dumps, "x"), annotators=())
    root = d.root_cause
    assert root.kind is FindingKind.COLLECTIVE_MISMATCH and root.ranks == (4,), root.detail
    assert root.seq == 4 and root.evidence["majority"] == [0, 1, 2, 3, 5]


def test_a_refused_pickle_in_a_worker_is_refused_in_the_replay(tmp_path, monkeypatch):
    from nccl_doctor.capture import fr_parallel

    monkeypatch.setattr(fr_parallel, "MIN_FILES", 2)
    directory = _job(tmp_path, 4, skipper=1)
    target = tmp_path / "pwned"
    (directory / "rank_3").write_bytes(pickle.dumps({"entries": [], "x": _Payload(target)}))
    with pytest.raises(RefusedInput, match="rank_3 is a pickle that asks for posix.system"):
        fr_parallel.load_window(directory, workers=2)
    assert not target.exists()


def test_the_window_keeps_what_the_analysis_needs(tmp_path, monkeypatch):
    """Cut to the window, the dumps give the diagnosis the whole dumps give."""
    from nccl_doctor.capture import fr_window

    monkeypatch.setattr(fr_window, "MARGIN", 1)  # these dumps are short: a narrow window
    whole = fr_dump.load_dumps(_job(tmp_path, 3, skipper=2))
    cut, kept, total = fr_window.trim(whole.by_rank)
    assert kept < total
    full = analyze(fr_dump.traces_from_dumps(fr_dump.Dumps(whole.by_rank), "x"), annotators=())
    windowed = analyze(fr_dump.traces_from_dumps(fr_dump.Dumps(cut), "x"), annotators=())
    assert [(f.kind, f.ranks, f.seq, f.callsite) for f in full.findings] == [
        (f.kind, f.ranks, f.seq, f.callsite) for f in windowed.findings]
    assert [r.last_collective for r in full.ranks] == [r.last_collective for r in windowed.ranks]
