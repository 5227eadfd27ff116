"""RL algorithm math: advantage estimators, loss aggregation, policy losses, KL estimators
and entropy, each registered by name.

``register_adv_est(name)`` adds an estimator; ``get_adv_estimator_fn(name)`` returns it, or
fails listing the registered names. Estimators take tensors (and the group ``index`` of each
row) and return ``(advantages, returns)``, both shaped like ``response_mask``.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any, Callable, Dict, Optional, Sequence, Tuple

import torch

from siirl.dag_worker.name_registry import NameRegistry
from siirl.errors import ConfigError
from siirl.execution.config_select import select

_ADV_ESTIMATORS = NameRegistry("algorithm.adv_estimator", "advantage estimator")


def register_adv_est(name: str) -> Callable[[Callable], Callable]:
    return _ADV_ESTIMATORS.register(name)


def get_adv_estimator_fn(name: str) -> Callable:
    return _ADV_ESTIMATORS.get(name)


def registered_adv_estimators() -> list:
    return _ADV_ESTIMATORS.names()


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


# ---- loss aggregation ----------------------------------------------------------------
#
# Each mode reduces a [B, R] loss matrix to a scalar and names the unit it averages over
# (tokens, non-empty sequences, or none for a plain sum). The actor uses that unit to
# weight micro-batches so that gradient accumulation reproduces the loss of the whole
# mini-batch exactly, whatever the micro-batch size or data-parallel split.

_AGG_MODES = NameRegistry("loss_agg_mode", "loss aggregation mode")


def register_agg_mode(name: str, units: Optional[Callable] = None):
    """``units(mask) -> count`` is what the mode divides by (None: the mode is a sum)."""
    def decorate(fn: Callable) -> Callable:
        _AGG_MODES.add(name, (fn, units))
        return fn

    return decorate


def _agg_mode(name: str) -> Tuple[Callable, Optional[Callable]]:
    return _AGG_MODES.get(name)


def _nonempty_rows(mask: torch.Tensor) -> torch.Tensor:
    return (mask.sum(dim=-1) > 0).to(mask.dtype)


@register_agg_mode("token-mean", units=lambda mask: mask.sum())
def _token_mean(loss_mat, mask):
    return masked_mean(loss_mat, mask)


# Fully masked rows (a filtered or empty response) are left out of the sequence mean, as
# in current verl, instead of counting as zero-loss sequences.
@register_agg_mode("seq-mean-token-sum", units=lambda mask: _nonempty_rows(mask).sum())
def _seq_mean_token_sum(loss_mat, mask):
    rows = _nonempty_rows(mask)
    return ((loss_mat * mask).sum(dim=-1) * rows).sum() / rows.sum().clamp_min(1)


@register_agg_mode("seq-mean-token-mean", units=lambda mask: _nonempty_rows(mask).sum())
def _seq_mean_token_mean(loss_mat, mask):
    rows = _nonempty_rows(mask)
    row_means = (loss_mat * mask).sum(dim=-1) / mask.sum(dim=-1).clamp_min(1)
    return (row_means * rows).sum() / rows.sum().clamp_min(1)


# Dr. GRPO: token sums divided by a constant horizon (the padded response length), so
# the per-token weight does not depend on how long the sampled responses were.
@register_agg_mode("seq-mean-token-sum-norm")
def _seq_mean_token_sum_norm(loss_mat, mask):
    return (loss_mat * mask).sum() / mask.shape[-1]


def agg_loss(loss_mat: torch.Tensor, loss_mask: torch.Tensor,
             loss_agg_mode: str = "token-mean") -> torch.Tensor:
    """Reduce a per-token loss ``[B, R]`` to a scalar over the tokens where mask is 1."""
    reduce, _ = _agg_mode(loss_agg_mode)
    return reduce(loss_mat, loss_mask.to(loss_mat.dtype))


def agg_loss_units(loss_mask: torch.Tensor, loss_agg_mode: str) -> Optional[torch.Tensor]:
    """What ``loss_agg_mode`` averages over in this mask (a count), or None for a sum."""
    _, units = _agg_mode(loss_agg_mode)
    return None if units is None else units(loss_mask.to(torch.float64))


def registered_agg_modes() -> list:
    return _AGG_MODES.names()


# ---- policy losses -------------------------------------------------------------------

_POLICY_LOSSES = NameRegistry("actor_rollout_ref.actor.policy_loss.loss_mode", "policy loss")


def register_policy_loss(name: str) -> Callable[[Callable], Callable]:
    """Register ``fn(old_log_prob, log_prob, advantages, response_mask, loss_agg_mode,
    config) -> (pg_loss, pg_clipfrac, ppo_kl, pg_clipfrac_lower)`` under ``name``."""
    return _POLICY_LOSSES.register(name)


def get_policy_loss_fn(name: str) -> Callable:
    return _POLICY_LOSSES.get(name)


@register_policy_loss("vanilla")
def compute_policy_loss_vanilla(old_log_prob: torch.Tensor, log_prob: torch.Tensor,
                                advantages: torch.Tensor, response_mask: torch.Tensor,
                                loss_agg_mode: str = "token-mean", config: Any = None):
    """PPO clipped surrogate with asymmetric clip range and dual clip (verl's definition).

    ratio = exp(log_prob - old_log_prob) (log-ratio clamped to [-20, 20] so exp cannot
    overflow); loss = max(-A*ratio, -A*clip(ratio, 1-low, 1+high)), and for A < 0 the
    loss is further capped at -A*clip_ratio_c (dual clip: a huge ratio on a negative
    advantage cannot dominate the update). Clip fractions and ppo_kl are token means.
    """
    clip_ratio = select(config, "clip_ratio", 0.2)
    low = select(config, "clip_ratio_low", clip_ratio)
    high = select(config, "clip_ratio_high", clip_ratio)
    clip_ratio_c = select(config, "clip_ratio_c", 3.0)
    if not clip_ratio_c > 1.0:
        raise ConfigError(f"actor_rollout_ref.actor.clip_ratio_c must be > 1.0 for dual-clip "
                          f"PPO, got {clip_ratio_c}")
    mask = response_mask.to(log_prob.dtype)
    neg_approx_kl = torch.clamp(log_prob - old_log_prob, min=-20.0, max=20.0)
    ratio = torch.exp(neg_approx_kl)
    ppo_kl = masked_mean(-neg_approx_kl, mask)

    losses_unclipped = -advantages * ratio
    losses_clipped = -advantages * torch.clamp(ratio, 1.0 - low, 1.0 + high)
    clip_losses = torch.maximum(losses_unclipped, losses_clipped)
    pg_clipfrac = masked_mean(torch.gt(losses_clipped, losses_unclipped).to(mask.dtype), mask)

    losses_dual = -advantages * clip_ratio_c
    dual_clip_losses = torch.minimum(losses_dual, clip_losses)
    negative = (advantages < 0).to(mask.dtype)
    pg_clipfrac_lower = masked_mean(torch.gt(clip_losses, losses_dual).to(mask.dtype) * negative,
                                    mask)
    pg_losses = torch.where(advantages < 0, dual_clip_losses, clip_losses)
    pg_loss = agg_loss(pg_losses, mask, loss_agg_mode)
    return pg_loss, pg_clipfrac, ppo_kl, pg_clipfrac_lower


# ---- KL estimators -------------------------------------------------------------------

_KL_ESTIMATORS = NameRegistry("kl penalty", "KL estimator")


def register_kl_estimator(*names: str):
    return _KL_ESTIMATORS.register(*names)


@register_kl_estimator("kl", "k1")
def _kl_k1(logprob, ref_logprob):
    return logprob - ref_logprob


@register_kl_estimator("abs")
def _kl_abs(logprob, ref_logprob):
    return (logprob - ref_logprob).abs()


@register_kl_estimator("mse", "k2")
def _kl_k2(logprob, ref_logprob):
    return 0.5 * (logprob - ref_logprob).square()


@register_kl_estimator("low_var_kl", "k3")
def _kl_k3(logprob, ref_logprob):
    # Schulman's k3 = r - log r - 1 with r = ref/actor; clamps as in verl keep one
    # diverged token from producing inf/nan.
    kl = torch.clamp(ref_logprob - logprob, min=-20.0, max=20.0)
    return torch.clamp(torch.exp(kl) - kl - 1.0, min=-10.0, max=10.0)


@register_kl_estimator("full")
def _kl_full(logprob, ref_logprob):
    raise ConfigError("kl penalty 'full' needs full-vocabulary log-probs of both policies; "
                      "only per-token log-probs are available here: use kl, abs, mse, "
                      "low_var_kl (or their k1/k2/k3 names, optionally with a '+' suffix)")


def kl_penalty(logprob: torch.Tensor, ref_logprob: torch.Tensor,
               kl_penalty: str) -> torch.Tensor:
    """Per-token KL(actor || ref) estimate.

    A trailing ``+`` (e.g. ``k3+``) gives the value of that estimator with the gradient of
    k2, which is an unbiased gradient of KL (the k1/k3 gradients are biased).
    """
    straight_through = kl_penalty.endswith("+")
    name = kl_penalty[:-1] if straight_through else kl_penalty
    estimator = _KL_ESTIMATORS.get(name, hint=" (each also with a '+' suffix)")
    value = estimator(logprob, ref_logprob)
    if not straight_through:
        return value
    k2 = _kl_k2(logprob, ref_logprob)
    return k2 - k2.detach() + value.detach()


# ---- entropy -------------------------------------------------------------------------

def entropy_from_logits(logits: torch.Tensor) -> torch.Tensor:
    """Per-position entropy of softmax(logits) over the last dim: logsumexp - E[logit]."""
    probs = torch.softmax(logits, dim=-1)
    return torch.logsumexp(logits, dim=-1) - (probs * logits).sum(dim=-1)


def compute_entropy_loss(logits_or_entropy: torch.Tensor, response_mask: torch.Tensor,
                         loss_agg_mode: str = "token-mean") -> torch.Tensor:
    """Aggregated entropy; accepts logits ``[B, R, V]`` or per-token entropy ``[B, R]``."""
    entropy = logits_or_entropy
    if logits_or_entropy.dim() == response_mask.dim() + 1:
        entropy = entropy_from_logits(logits_or_entropy)
    return agg_loss(entropy, response_mask, loss_agg_mode)
