"""The reference trainers' building blocks: the papers' losses on hand-computed values, and the
offline tiny model and tokenizer."""

from __future__ import annotations

import math

import torch

from nccl_doctor.trainers import losses, tiny


def _t(*values: float) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.float64)


def sig(x: float) -> float:
    return 1 / (1 + math.exp(-x))


def test_dpo_matches_the_formula():
    loss, rw, rl = losses.dpo(_t(-3.0), _t(-5.0), _t(-4.0), _t(-4.5), beta=0.5)
    # beta * ((-3 + 4) - (-5 + 4.5)) = 0.5 * 1.5
    assert math.isclose(loss.item(), -math.log(sig(0.75)))
    assert rw.item() == 0.5 and rl.item() == -0.25


def test_cpo_simpo_orpo_match_their_formulas():
    lw, ll, nw, nl = _t(-4.0), _t(-6.0), _t(2.0), _t(3.0)
    loss, _, _ = losses.cpo(lw, ll, nw, beta=0.1, alpha=1.0)
    assert math.isclose(loss.item(), -math.log(sig(0.1 * 2.0)) + 2.0)
    loss, rw, rl = losses.simpo(lw, ll, nw, nl, beta=2.0, gamma=0.5)
    assert math.isclose(rw.item(), -4.0) and math.isclose(rl.item(), -4.0)
    assert math.isclose(loss.item(), -math.log(sig(-0.5)))
    loss, _, _ = losses.orpo(lw, ll, nw, nl, lam=0.1)
    pw, pl = math.exp(-2.0), math.exp(-2.0)
    odds = math.log(pw / (1 - pw)) - math.log(pl / (1 - pl))
    assert math.isclose(loss.item(), 2.0 + 0.1 * -math.log(sig(odds)), rel_tol=1e-6)


def test_grpo_advantages_and_loss():
    adv, std = losses.grpo_advantages(_t(1.0, 3.0, 5.0, 5.0), group=2)
    # group [1, 3]: mean 2, (unbiased) std sqrt(2); group [5, 5]: no spread
    r = 1 / math.sqrt(2)
    assert torch.allclose(adv, _t(-r, r, 0, 0), atol=1e-3)
    assert std.tolist()[1] == 0  # identical samples: no signal in that group (std per group)
    lp = torch.zeros(2, 3, dtype=torch.float64)
    mask = torch.tensor([[1, 1, 0], [1, 1, 1]], dtype=torch.float64)
    # ratio 1 everywhere: the loss is minus the token-weighted mean advantage
    loss = losses.grpo(lp, lp, _t(1.0, -1.0), mask)
    assert math.isclose(loss.item(), -(2 * 1.0 + 3 * -1.0) / 5)


def test_tiny_model_is_the_same_everywhere_and_leaves_the_rng_alone():
    torch.manual_seed(123)
    before = torch.random.get_rng_state()
    a, b = tiny.model(seed=3), tiny.model(seed=3)
    assert torch.equal(torch.random.get_rng_state(), before)
    assert all(torch.equal(x, y) for x, y in zip(a.state_dict().values(),
                                                 b.state_dict().values()))
    c = tiny.model(seed=4)
    assert not torch.equal(a.lm_head.weight, c.lm_head.weight)


def test_tiny_tokenizer_round_trips_offline():
    tok = tiny.tokenizer()
    ids = tok("w1 w5 w91 nope")["input_ids"]
    assert ids == [5, 9, 95, 3]
    assert tok.decode(ids[:3]) == "w1 w5 w91"
    batch = tok(["w1", "w2 w3 w4"], padding=True)["input_ids"]
    assert batch[0][:2] == [tiny.PAD, tiny.PAD]  # left padding, for generation
    data = tiny.preference_data(8, seed=1)
    assert len({len(p.chosen.split()) for p in data}) > 1  # lengths vary: ranks pad differently
    assert data == tiny.preference_data(8, seed=1)
