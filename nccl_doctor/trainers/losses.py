"""The papers' losses, on per-sequence log-probabilities. ``w``: chosen, ``l``: rejected.

Inputs are tensors of shape ``[B]``: ``logp_*`` the summed token log-probabilities of the
response given the prompt, ``len_*`` the response lengths in tokens, ``ref_*`` the same under the
frozen reference model. Each returns ``(loss, chosen_reward, rejected_reward)``, the rewards being
the per-example margins trainers log (``[B]``).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def dpo(logp_w, logp_l, ref_w, ref_l, beta: float = 0.1):
    """DPO (Rafailov et al., 2023):
    L = -log sigmoid(beta * [(log pi(y_w|x) - log ref(y_w|x)) - (log pi(y_l|x) - log ref(y_l|x))])
    """
    rw, rl = beta * (logp_w - ref_w), beta * (logp_l - ref_l)
    return -F.logsigmoid(rw - rl).mean(), rw.detach(), rl.detach()


def cpo(logp_w, logp_l, len_w, beta: float = 0.1, alpha: float = 1.0):
    """CPO (Xu et al., 2024), reference-free:
    L = -log sigmoid(beta * (log pi(y_w|x) - log pi(y_l|x))) + alpha * NLL(y_w),
    NLL(y_w) = -log pi(y_w|x) / |y_w| (the behaviour-cloning term)."""
    rw, rl = beta * logp_w, beta * logp_l
    nll = -(logp_w / len_w.clamp(min=1)).mean()
    return -F.logsigmoid(rw - rl).mean() + alpha * nll, rw.detach(), rl.detach()


def simpo(logp_w, logp_l, len_w, len_l, beta: float = 2.0, gamma: float = 0.5):
    """SimPO (Meng et al., 2024), length-normalised and reference-free:
    L = -log sigmoid(beta/|y_w| * log pi(y_w|x) - beta/|y_l| * log pi(y_l|x) - gamma)."""
    rw = beta * logp_w / len_w.clamp(min=1)
    rl = beta * logp_l / len_l.clamp(min=1)
    return -F.logsigmoid(rw - rl - gamma).mean(), rw.detach(), rl.detach()


def orpo(logp_w, logp_l, len_w, len_l, lam: float = 0.1):
    """ORPO (Hong et al., 2024):
    L = NLL(y_w) + lambda * -log sigmoid(log odds(y_w|x) - log odds(y_l|x)),
    odds(y|x) = P / (1 - P) with P = exp(log pi(y|x) / |y|) (the mean token probability)."""
    mw, ml = logp_w / len_w.clamp(min=1), logp_l / len_l.clamp(min=1)

    def log_odds(m):
        return m - torch.log1p(-torch.exp(m).clamp(max=1 - 1e-6))

    ratio = log_odds(mw) - log_odds(ml)
    loss = -mw.mean() + lam * -F.logsigmoid(ratio).mean()
    return loss, (lam * mw).detach(), (lam * ml).detach()


def grpo_advantages(rewards, group: int, eps: float = 1e-4):
    """GRPO (Shao et al., 2024): A_i = (r_i - mean(r_group)) / (std(r_group) + eps), over the G
    samples of each prompt (``rewards`` holds consecutive groups of ``group``). Returns the
    advantages ([N]) and each group's reward std ([N // group]): 0 means no signal there."""
    r = rewards.view(-1, group)
    mean, std = r.mean(dim=1, keepdim=True), r.std(dim=1, keepdim=True)
    return ((r - mean) / (std + eps)).view(-1), std.view(-1)


def grpo(logp_tokens, old_logp_tokens, advantages, mask, clip: float = 0.2):
    """GRPO's clipped surrogate, token-level, without the KL term (beta = 0):
    L = -mean_t min(rho_t * A, clip(rho_t, 1 - eps, 1 + eps) * A), rho_t = pi / pi_old."""
    ratio = torch.exp(logp_tokens - old_logp_tokens)
    a = advantages.unsqueeze(1)
    per_token = -torch.min(ratio * a, ratio.clamp(1 - clip, 1 + clip) * a)
    return (per_token * mask).sum() / mask.sum().clamp(min=1)
