"""Small pure pieces of the model: tensor descriptions, exits, integrity, events."""

from __future__ import annotations

import pytest

from nccl_doctor.model import (
    Location, EventFlag, ExitKind, Integrity, RankExit, TensorSig, parse_tensor_desc,
)


@pytest.mark.parametrize(
    "desc, expected",
    [
        ("float32[2,7,32]", (TensorSig("float32", (2, 7, 32)),)),
        ("4*bfloat16[8]", (TensorSig("bfloat16", (8,), 4),)),
        ("int64[]", (TensorSig("int64", ()),)),
        ("float32[2];int64[3]", (TensorSig("float32", (2,)), TensorSig("int64", (3,)))),
        ("", ()),
        ("not a tensor", ()),
    ],
)
def test_parse_tensor_desc(desc, expected) -> None:
    assert parse_tensor_desc(desc) == expected


def test_tensor_sig_str_round_trips() -> None:
    for desc in ("float32[2,7,32]", "4*bfloat16[8]", "int64[]"):
        (sig,) = parse_tensor_desc(desc)
        assert str(sig) == desc


def test_rank_exit_abnormal() -> None:
    assert not RankExit(ExitKind.CLEAN, code=0).abnormal
    assert not RankExit(ExitKind.CLEAN).abnormal
    assert RankExit(ExitKind.CLEAN, code=2).abnormal
    assert not RankExit(ExitKind.RUNNING).abnormal
    for kind in (ExitKind.EXCEPTION, ExitKind.SIGNAL, ExitKind.VANISHED):
        assert RankExit(kind).abnormal


def test_rank_exit_describe() -> None:
    exc = RankExit(ExitKind.EXCEPTION, exception="RuntimeError: [/gloo/pair.cc:534] Connection "
                   "closed by peer [10.0.0.2]:4242")
    assert exc.describe() == ("raised RuntimeError: [/gloo/pair.cc:534] Connection closed by "
                              "peer [10.0.0.2]:4242")
    short = exc.describe(short=True)
    assert short.startswith("raised RuntimeError: Connection closed by peer")
    assert len(short) <= 60
    long = RankExit(ExitKind.EXCEPTION, exception="ValueError: " + "x" * 100).describe(short=True)
    assert len(long) == 60 and long.endswith("...")
    assert RankExit(ExitKind.CLEAN, code=0).describe() == "exited cleanly"
    assert RankExit(ExitKind.CLEAN, code=3).describe() == "exited with status 3"
    assert RankExit(ExitKind.SIGNAL, signal="SIGSEGV").describe() == "was killed by SIGSEGV"
    assert "SIGKILL" in RankExit(ExitKind.VANISHED).describe()
    assert RankExit(ExitKind.RUNNING).describe() == "was still running"


def test_integrity() -> None:
    assert Integrity().complete and Integrity().describe() == "complete"
    assert Integrity(overwritten=5).complete
    assert not Integrity(torn_records=1).complete
    assert not Integrity(truncated=True).complete
    assert not Integrity(bad_strings=2).complete
    assert Integrity(2, True, 3, 1).describe() == (
        "file truncated, 2 torn record(s), 1 corrupt string(s), "
        "3 oldest event(s) overwritten by the ring"
    )


def test_event_properties(tb) -> None:
    e = tb.event(5, seq=9, seq_offset=2)
    assert e.align_seq == 7
    assert tb.event(1, seq=-1).align_seq == -1
    assert tb.event(1, flags=EventFlag.COMPOSITE | EventFlag.ASYNC).is_composite
    assert not tb.event(1, flags=EventFlag.ASYNC).is_composite
    assert e.where == "/job/train.py:105"
    assert str(Location("/a.py", 3, "f")) == "/a.py:3"
    assert Location("/a.py", 3, "f").to_json() == {"path": "/a.py", "line": 3, "function": "f"}
