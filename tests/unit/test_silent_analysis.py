"""Silent-error analysis on synthetic notes, the metrics-log parser, and the in-rank hashes."""

from __future__ import annotations

import random
from dataclasses import replace

from nccl_doctor.analysis.silent.sampling import (
    detect_identical_completions, detect_shared_rng_state,
)
from nccl_doctor.analysis.silent.degenerate import degenerate, detect_degenerate_signal
from nccl_doctor.diagnosis import FindingKind, Severity
from nccl_doctor.capture import metrics_log
from nccl_doctor.rank.fingerprint import rng_fingerprint, row_digests


def _gen(n: int, out: str, *, prompt: str = "p", rng: str = "r", sample: bool = True) -> dict:
    return {"note": "gen", "n": n, "all": out, "nrows": 2, "prompts_all": prompt,
            "rng": {"torch": rng}, "sample": sample, "source": "transformers",
            "time_ns": 1000 + n}


def _traces(tb, per_rank: dict[int, list[dict]], nodes: dict[int, int] | None = None):
    traces = []
    for rank, notes in per_rank.items():
        t = tb.trace(rank, world_size=len(per_rank))
        meta = replace(t.meta, node_rank=(nodes or {}).get(rank, 0))
        traces.append(replace(t, meta=meta, notes=tuple(notes)))
    return tb.traceset(traces)


def test_node_seeded_ranks_are_described_per_node(tb):
    # ranks 0-1 on node 0 share outputs and state, ranks 2-3 on node 1 share others
    notes = {r: [_gen(k, f"out{r // 2}-{k}", rng=f"s{r // 2}-{k}") for k in range(1, 4)]
             for r in range(4)}
    traces = _traces(tb, notes, nodes={0: 0, 1: 0, 2: 1, 3: 1})
    (same,) = detect_identical_completions(traces)
    assert same.severity is Severity.WARNING and same.evidence["classes"] == [[0, 1], [2, 3]]
    assert same.title.startswith("all local ranks of each node sampled identical completions; "
                                 "completions differ across nodes (3 of 3 generations")
    (rng,) = detect_shared_rng_state(traces)
    assert rng.title.startswith("all local ranks of each node share one seed")


def test_k_of_n_generations_are_needed(tb):
    # ranks 0 and 1 match once in 3 generations: chance, not a shared seed
    notes = {0: [_gen(k, f"a{k}", rng=f"x{k}") for k in range(1, 4)],
             1: [_gen(1, "a1", rng="x1"), _gen(2, "b2", rng="y2"), _gen(3, "b3", rng="y3")]}
    traces = _traces(tb, notes)
    assert detect_identical_completions(traces) == []
    assert detect_shared_rng_state(traces) == []


def test_greedy_is_a_note_and_shared_state_on_other_prompts_is_fine(tb):
    greedy = {r: [_gen(k, f"g{k}", sample=False) for k in range(1, 3)] for r in range(2)}
    (note,) = detect_identical_completions(_traces(tb, greedy))
    assert note.severity is Severity.INFO and "deterministic decoding" in note.title
    assert detect_shared_rng_state(_traces(tb, greedy)) == []
    # DDP-style: one seed everywhere, but each rank samples its own prompts
    own = {r: [_gen(k, f"o{r}{k}", prompt=f"p{r}", rng="same") for k in range(1, 3)]
           for r in range(2)}
    assert detect_shared_rng_state(_traces(tb, own)) == []
    assert detect_identical_completions(_traces(tb, own)) == []


def test_degenerate_signal_needs_consecutive_steps():
    dead = {"loss": 0.0, "reward": 1.0, "reward_std": 0.0}
    live = {"loss": 0.0, "reward": 1.0, "reward_std": 0.7}
    rows = [(1, dead), (2, dead), (3, live), (4, dead), (5, dead), (6, dead)]
    (f,) = degenerate(rows, steps=3)
    assert f.kind is FindingKind.DEGENERATE_SIGNAL
    assert f.evidence["at"]["reward_std"] == [4, 5, 6] and "steps 4-6" in f.title
    assert degenerate(rows[:5], steps=3) == []
    # GRPO's loss rounds to 0 while rewards spread: alive
    assert degenerate([(s, live) for s in range(1, 9)], steps=3) == []
    # KL exactly 0 (policy never moves) and OpenRLHF-style names
    kl = [(s, {"policy_loss": 0.3, "kl": 0.0}) for s in range(3)]
    assert degenerate(kl)[0].evidence["criteria"] == ["kl"]
    assert degenerate([(s, {"frac_reward_zero_std": 1.0}) for s in range(3)])


def test_signal_from_a_log_when_the_capture_has_none(tb):
    rows = tuple((s, {"loss": 0.0, "reward_std": 0.0}) for s in range(1, 5))
    traces = replace(tb.traceset([tb.trace(0)]), metrics_log=rows)
    assert detect_degenerate_signal(traces)[0].evidence["criteria"] == ["reward_std", "loss"]
    assert detect_degenerate_signal(tb.traceset([tb.trace(0)])) == []


def test_log_parser_reads_trainer_lines_and_executes_nothing(tmp_path):
    marker = tmp_path / "pwned"
    lines = [
        "{'loss': '0', 'grad_norm': '0', 'reward': '6', 'reward_std': '0', 'epoch': '0.06'}",
        '{"step": 7, "loss": 0.0, "reward_std": 0.0, "kl": 0.0}',  # JSON, ms-swift jsonl
        "Episode [1/2]:  40%|####  | 4/10 [00:04<00:06, policy_loss=0, reward=1, kl=0]",
        "Step 3: loss = 0.12 (just one metric word is not a metrics line)",
        f"{{'loss': __import__('os').system('touch {marker}')}}",  # never executed
        "{'a': " * 3000,  # deeply nested garbage
        "plain text, nothing here",
    ]
    rows = metrics_log.parse_lines(lines)
    assert not marker.exists()
    assert [r[0] for r in rows] == [1, 7, 3]
    assert rows[0][1]["reward_std"] == 0.0 and rows[0][1]["reward"] == 6.0
    assert rows[1][1]["kl"] == 0.0
    assert rows[2][1] == {"policy_loss": 0.0, "reward": 1.0, "kl": 0.0}


def test_fingerprints_follow_the_seed():
    import torch

    state = random.getstate()
    try:
        torch.manual_seed(5)
        random.seed(5)
        a = rng_fingerprint()
        torch.rand(3)
        b = rng_fingerprint()
        torch.manual_seed(5)
        c = rng_fingerprint()
    finally:
        random.setstate(state)
    assert a["torch"] != b["torch"] and a["torch"] == c["torch"]
    assert a["python"] == c["python"] and len(a["torch"]) == 16
    rows, every, n = row_digests(torch.tensor([[1, 2], [1, 2], [3, 4]]), limit=2)
    assert n == 3 and len(rows) == 2 and rows[0] == rows[1]
    assert every != row_digests(torch.tensor([[1, 2], [1, 2], [3, 5]]))[1]
    assert row_digests(["x", "x"])[0][0] == row_digests("x")[0][0]


def test_public_api_outside_nccl_doctor_does_nothing():
    import nccl_doctor

    assert nccl_doctor.observe_completions(["a", "b"]) is False
    assert nccl_doctor.observe_metrics(1, {"loss": 0.0}) is False
    assert nccl_doctor.mark_step(1) is False


def test_odd_notes_never_crash_the_analysis(tb):
    from nccl_doctor.analysis import analyze
    bad = [{"note": "gen", "n": "x", "all": ["list"], "rng": "nope", "time_ns": "t"},
           {"note": "gen", "n": 2, "all": {"a": 1}, "nrows": 2, "sample": "yes"},
           {"note": "metrics", "step": "s", "values": {"loss": "0", "kl": float("nan")}},
           {"note": "metrics", "values": ["loss", 0]},
           {"note": "rng", "label": 3, "time_ns": None}]
    traces = _traces(tb, {0: bad, 1: bad})
    d = analyze(traces)
    assert not [n for n in d.notes if "failed" in n], d.notes
    assert not [f for f in d.findings if f.severity is not Severity.INFO]


def test_a_failing_pass_leaves_a_note_not_a_traceback(tb):
    from nccl_doctor.analysis import PASSES, analyze
    def broken(_traces):
        raise KeyError("boom")

    d = analyze(tb.traceset([tb.trace(0)]), PASSES + (broken,))
    assert any("broken failed" in n for n in d.notes)


def test_same_state_without_prompts_and_one_tp_engine_are_not_the_seed_bug(tb):
    no_prompts = {r: [_gen(k, f"o{r}{k}", prompt="", rng="same") for k in range(1, 3)]
                  for r in range(2)}
    assert detect_shared_rng_state(_traces(tb, no_prompts)) == []
    # ranks 0-1 and 2-3 are two tensor-parallel vLLM engines (tp=2): identical inside each
    tp = {r: [dict(_gen(k, f"e{r // 2}{k}"), source="vllm", tp=2) for k in range(1, 3)]
          for r in range(4)}
    assert detect_identical_completions(_traces(tb, tp)) == []
    # ... but two engines producing the same outputs are
    both = {r: [dict(_gen(k, f"e{k}"), source="vllm", tp=2) for k in range(1, 3)]
            for r in range(4)}
    (f,) = detect_identical_completions(_traces(tb, both))
    assert f.ranks == (0, 1, 2, 3)


def test_kl_at_zero_with_a_reward_spread_is_a_disabled_penalty():
    rows = [(s, {"kl": 0.0, "reward_std": 0.4, "loss": 0.2}) for s in range(5)]
    assert degenerate(rows) == []
