"""RL algorithm math: advantage estimators, registered by name.

``register_adv_est(name)`` adds an estimator; ``get_adv_estimator_fn(name)`` returns it, or
fails listing the registered names. Estimators take tensors (and the group ``index`` of each
row) and return ``(advantages, returns)``, both shaped like ``response_mask``.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Callable, Dict, Sequence

import torch

from siirl.errors import ConfigError

_ADV_ESTIMATORS: Dict[str, Callable] = {}


def register_adv_est(name: str) -> Callable[[Callable], Callable]:
    def decorate(fn: Callable) -> Callable:
        if name in _ADV_ESTIMATORS and _ADV_ESTIMATORS[name] is not fn:
            raise ValueError(f"advantage estimator '{name}' is already registered")
        _ADV_ESTIMATORS[name] = fn
        return fn

    return decorate


def get_adv_estimator_fn(name: str) -> Callable:
    key = getattr(name, "value", name)
    if key not in _ADV_ESTIMATORS:
        raise ConfigError(f"algorithm.adv_estimator={key!r} is not registered; registered: "
                          f"{', '.join(sorted(_ADV_ESTIMATORS))}")
    return _ADV_ESTIMATORS[key]


def registered_adv_estimators() -> list:
    return sorted(_ADV_ESTIMATORS)


def masked_mean(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    return (values * mask).sum() / mask.sum().clamp_min(1)


def masked_whiten(values: torch.Tensor, mask: torch.Tensor, shift_mean: bool = True,
                  eps: float = 1e-8) -> torch.Tensor:
    """Normalise to zero mean, unit variance over the masked entries (unbiased variance)."""
    mean = masked_mean(values, mask)
    centered = values - mean
    count = mask.sum()
    variance = (centered.pow(2) * mask).sum() / (count - 1).clamp_min(1)
    whitened = centered * torch.rsqrt(variance + eps)
    return whitened if shift_mean else whitened + mean


@register_adv_est("grpo")
def compute_grpo_outcome_advantage(token_level_rewards: torch.Tensor,
                                   response_mask: torch.Tensor, index: Sequence,
                                   epsilon: float = 1e-6,
                                   norm_adv_by_std_in_grpo: bool = True):
    """Outcome reward minus its group mean, divided by the group std (unbiased) when asked.

    A group of one sample has mean 0 and std 1, so its advantage is its own score.
    """
    scores = token_level_rewards.sum(dim=-1)
    groups: Dict = defaultdict(list)
    for row, uid in enumerate(index):
        groups[uid].append(row)
    advantages = torch.empty_like(scores)
    for rows in groups.values():
        group_scores = scores[rows]
        if len(rows) == 1:
            mean, std = torch.zeros((), dtype=scores.dtype), torch.ones((), dtype=scores.dtype)
        else:
            mean, std = group_scores.mean(), group_scores.std()
        centred = group_scores - mean
        advantages[rows] = centred / (std + epsilon) if norm_adv_by_std_in_grpo else centred
    advantages = advantages.unsqueeze(-1) * response_mask
    return advantages, advantages


@register_adv_est("gae")
def compute_gae_advantage_return(token_level_rewards: torch.Tensor, values: torch.Tensor,
                                 response_mask: torch.Tensor, gamma: float, lam: float):
    """Generalised advantage estimation; advantages whitened over the response mask.

    Masked (padding) positions neither add reward nor break the recursion: the running
    estimate and the next value carry across them.
    """
    with torch.no_grad():
        next_value = torch.zeros_like(values[:, 0])
        running = torch.zeros_like(values[:, 0])
        reversed_adv = []
        for t in reversed(range(token_level_rewards.shape[1])):
            mask_t = response_mask[:, t].to(values.dtype)
            delta = token_level_rewards[:, t] + gamma * next_value - values[:, t]
            candidate = delta + gamma * lam * running
            running = candidate * mask_t + (1 - mask_t) * running
            next_value = values[:, t] * mask_t + (1 - mask_t) * next_value
            reversed_adv.append(running)
        advantages = torch.stack(reversed_adv[::-1], dim=1)
        returns = advantages + values
        advantages = masked_whiten(advantages, response_mask) * response_mask
    return advantages, returns
