"""Rollout correction (verl's ``algorithm.rollout_correction``): importance weights and
rejection of tokens or sequences, from the log-ratio log r = log pi_train - log pi_rollout
of each sampled token, where pi_rollout is the policy that sampled it (``rollout_log_probs``).

- Importance weights (``rollout_is``), detached, zero on padding, truncated at
  ``rollout_is_threshold`` (T): token: w_t = min(exp(clamp(log r_t, +-20)), T); sequence:
  w = min(exp(clamp(sum_t log r_t, +-20)), T) on every token of the row. With
  ``rollout_is_batch_normalize`` they are divided by their mean over the batch (all
  data-parallel ranks): the token mean, or at sequence level the mean over non-empty rows.
- Rejection (``rollout_rs``): per token k1 = -log r, k2 = (log r)^2 / 2, k3 = exp(log r)
  - 1 - log r (log r clamped to +-20); a token criterion tests each token, ``seq_sum`` /
  ``seq_mean`` / ``seq_max`` the row's sum / mean / max over its tokens, and a failing row
  loses all its tokens. k1 keeps log(lower) <= value <= log(upper), k2/k3 value <= upper.
  Every criterion must pass; the rejected tokens leave the response mask.
- Where pi_train comes from: decoupled mode (``bypass_mode=false``) uses the old log-probs,
  once per batch before the update, and the policy loss is multiplied by the weights;
  bypass mode takes the rollout's log-probs as the old ones (no old-log-prob pass) and
  compares the current policy with them in every micro-batch: ``loss_type=ppo_clip`` is
  the PPO loss with ratio pi_theta / pi_rollout (weights for the metrics only),
  ``reinforce`` is -w A log pi_theta (``reinforce_loss``).

Metrics are verl's, under ``rollout_corr/`` (``rollout_correction_metrics``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Callable, Dict, Optional

import torch

from siirl.dag_worker.core_algos.common import masked_mean
from siirl.dag_worker.core_algos.loss_aggregation import agg_loss
from siirl.dag_worker.core_algos.rollout_correction_metrics import (
    SAFETY_BOUND,
    is_metrics,
    offpolicy_metrics,
    rs_metrics,
)
from siirl.params.rollout_correction import (
    RolloutCorrectionArguments,
    rs_options,
    rs_thresholds,
)

PREFIX = "rollout_corr/"
# float32 [B, R]: decoupled mode's weights, set in the batch the update reads
ROLLOUT_IS_WEIGHTS = "rollout_is_weights"
# sums a tensor over the data-parallel ranks in place (None: this process has the batch)
AllReduce = Optional[Callable[[torch.Tensor], None]]


@dataclass
class Correction:
    """What the correction gives the loss: the weights (None without ``rollout_is``), the
    response mask without the rejected tokens, and the metrics (``rollout_corr/...``)."""

    weights: Optional[torch.Tensor]
    mask: torch.Tensor
    metrics: Dict[str, float] = field(default_factory=dict)


def _clamped(log_ratio: torch.Tensor) -> torch.Tensor:
    return torch.clamp(log_ratio, min=-SAFETY_BOUND, max=SAFETY_BOUND)


def is_weights(log_ratio: torch.Tensor, mask: torch.Tensor, level: str, threshold: float,
               batch_normalize: bool = False, all_reduce: AllReduce = None):
    """Truncated importance weights [B, T] (detached, 0 on padding) and their metrics."""
    mask = mask.to(log_ratio.dtype)
    if level == "token":
        for_metrics = log_ratio
        weights = torch.exp(_clamped(log_ratio))
    elif level == "sequence":
        for_metrics = (log_ratio * mask).sum(dim=-1, keepdim=True)
        weights = torch.exp(_clamped(for_metrics)).expand_as(log_ratio)
    else:
        raise ValueError(f"rollout_is must be token or sequence, got {level!r}")
    weights = weights * mask
    metrics = is_metrics(weights, for_metrics, mask, level, threshold) if mask.any() else {}
    weights = weights.clamp(max=threshold).detach()
    if batch_normalize:
        if level == "token":
            total = torch.stack([(weights * mask).sum(), mask.sum()])
        else:  # one weight per non-empty row
            rows = (mask.sum(dim=-1) > 0).to(weights.dtype)
            total = torch.stack([(masked_mean(weights, mask, axis=-1) * rows).sum(), rows.sum()])
        if all_reduce is not None:
            all_reduce(total)
        mean = total[0] / total[1].clamp_min(1e-8)
        if mean > 1e-8:
            weights = weights / mean
            metrics["rollout_is_batch_norm_factor"] = float(mean)
        else:
            metrics["rollout_is_batch_norm_factor"] = 1.0
    return weights, metrics


def _criterion(option: str, log_ratio: torch.Tensor, mask: torch.Tensor):
    """(per-token value [B, T], per-row value [B] or None) of criterion ``option``."""
    safe = _clamped(log_ratio)
    kind = option[-2:]
    token = -safe if kind == "k1" else 0.5 * safe.square() if kind == "k2" else \
        torch.exp(safe) - 1.0 - safe
    if option.startswith("token_"):
        return token, None
    if option.startswith("seq_sum_"):
        row = (token * mask).sum(dim=-1)
    elif option.startswith("seq_mean_"):
        row = masked_mean(token, mask, axis=-1)
    else:  # seq_max_: the largest token value (0 for a row without tokens)
        row = token.masked_fill(~mask.bool(), float("-inf")).max(dim=-1).values
        row = torch.where(torch.isinf(row), torch.zeros_like(row), row)
    return row.unsqueeze(-1).expand_as(token), row


def rejection_mask(log_ratio: torch.Tensor, mask: torch.Tensor, rollout_rs: str,
                   rollout_rs_threshold):
    """The response mask without the tokens ``rollout_rs``'s criteria reject, and the
    rejection metrics."""
    options = rs_options(rollout_rs)
    bounds = rs_thresholds(options, rollout_rs_threshold)
    mask_f = mask.to(log_ratio.dtype)
    valid = mask_f.bool()
    rows = valid.any(dim=-1)
    keep_all = torch.ones_like(mask_f)
    metrics: Dict[str, float] = {}
    for option in options:
        lower, upper = bounds[option]
        token_stat, row_stat = _criterion(option, log_ratio, mask_f)
        if option.endswith("k1"):
            lower_b, upper_b = math.log(lower), math.log(upper)
            keep = (token_stat >= lower_b) & (token_stat <= upper_b)
        else:
            lower_b, upper_b = None, upper
            keep = token_stat <= upper_b
        keep_all = keep_all * keep.to(mask_f.dtype)
        if not valid.any():
            continue
        metrics.update(rs_metrics(option, token_stat, row_stat, mask_f, upper_b, lower_b))
        metrics[f"rollout_rs_{option}_masked_fraction"] = float(
            masked_mean((~keep).to(mask_f.dtype), mask_f))
        row_kept = ~((~keep) & valid).any(dim=-1)
        metrics[f"rollout_rs_{option}_seq_masked_fraction"] = float(
            (~row_kept[rows]).float().mean()) if rows.any() else 0.0
    if valid.any():
        metrics["rollout_rs_masked_fraction"] = float(masked_mean(1.0 - keep_all, mask_f))
        metrics["rollout_rs_seq_masked_fraction"] = float(
            ((keep_all < 0.5) & valid).any(dim=-1).float().mean())
    return (mask_f * keep_all).to(mask.dtype), metrics


def correct_rollout(train_log_prob: torch.Tensor, rollout_log_prob: torch.Tensor,
            mask: torch.Tensor, cfg: RolloutCorrectionArguments,
            all_reduce: AllReduce = None) -> Correction:
    """Weights, rejection and metrics of ``cfg`` for the trainer's log-probs against the
    rollout's (verl's ``compute_rollout_correction_and_rejection_mask``)."""
    if train_log_prob.shape != rollout_log_prob.shape or train_log_prob.shape != mask.shape:
        raise ValueError(f"rollout correction: log-prob shapes {tuple(train_log_prob.shape)} "
                         f"and {tuple(rollout_log_prob.shape)} and the response mask's "
                         f"{tuple(mask.shape)} differ")
    train_log_prob, rollout_log_prob = train_log_prob.detach(), rollout_log_prob.detach()
    log_ratio = train_log_prob - rollout_log_prob
    metrics: Dict[str, float] = {}
    weights = None
    if cfg.rollout_is is not None:
        weights, is_m = is_weights(log_ratio, mask, cfg.rollout_is,
                                   float(cfg.rollout_is_threshold),
                                   bool(cfg.rollout_is_batch_normalize), all_reduce)
        metrics.update(is_m)
    kept = mask
    if cfg.rollout_rs is not None:
        kept, rs_m = rejection_mask(log_ratio, mask, cfg.rollout_rs, cfg.rollout_rs_threshold)
        metrics.update(rs_m)
    if mask.any():
        metrics.update(offpolicy_metrics(train_log_prob, rollout_log_prob,
                                         mask.to(log_ratio.dtype)))
    return Correction(weights, kept, {PREFIX + k: v for k, v in metrics.items()})


def reinforce_loss(rollout_log_prob: torch.Tensor, log_prob: torch.Tensor,
                   advantages: torch.Tensor, response_mask: torch.Tensor,
                   loss_agg_mode: str = "token-mean",
                   weights: Optional[torch.Tensor] = None):
    """Bypass mode's ``loss_type=reinforce``: -A * log pi_theta (times the detached weights
    when given), aggregated by ``loss_agg_mode``; in the policy losses' return shape
    (pg_loss, clipfrac 0, ppo_kl = mean(log pi_rollout - log pi_theta), clipfrac_lower 0)."""
    losses = -advantages * log_prob
    if weights is not None:
        losses = losses * weights
    mask = response_mask.to(log_prob.dtype)
    pg_loss = agg_loss(losses, mask, loss_agg_mode)
    ppo_kl = masked_mean(rollout_log_prob - log_prob.detach(), mask)
    zero = torch.zeros((), dtype=log_prob.dtype, device=log_prob.device)
    return pg_loss, zero, ppo_kl, zero
