"""The diagnostics of rollout correction, with verl's names (``rollout_corr/`` is added by
``rollout_correction.correct_rollout``): the importance weights' spread (``rollout_is_*``), each
rejection criterion's statistic (``rollout_rs_<criterion>_*``) and the gap between the
trainer's and the rollout's policy (``kl``, ``k3_kl``, perplexities, chi-squared).

All are computed over the rows given (a worker's slice of the batch); rows without a
response token are left out of the per-sequence statistics as in verl.
"""

from __future__ import annotations

import math
from typing import Dict, Optional

import torch

from siirl.dag_worker.core_algos.common import masked_mean

SAFETY_BOUND = 20.0  # |log r| is clamped here before exp (exp(20) ~ 4.9e8)


def _std(values: torch.Tensor, mask: torch.Tensor, low: float, high: float) -> float:
    """Masked standard deviation of ``values`` clamped to [low, high] (as verl: stable)."""
    if mask.sum() <= 1:
        return 0.0
    clamped = values.clamp(min=low, max=high)
    mean = masked_mean(clamped, mask)
    return float(torch.sqrt(torch.clamp(masked_mean(clamped.square(), mask) - mean.square(),
                                        min=0.0)))


def _seq_summary(prefix: str, seq: torch.Tensor, ideal: float, high: float,
                 low: Optional[float]) -> Dict[str, float]:
    """Mean/std/max/min of per-sequence values, their largest deviation from ``ideal`` and
    the share of sequences above ``high`` (and below ``low``)."""
    if seq.numel() == 0:
        return {f"{prefix}_seq_{k}": 0.0 for k in ("mean", "std", "max", "min",
                                                   "max_deviation", "fraction_high")}
    out = {f"{prefix}_seq_mean": float(seq.mean()),
           f"{prefix}_seq_std": float(seq.std()) if seq.numel() > 1 else 0.0,
           f"{prefix}_seq_max": float(seq.max()), f"{prefix}_seq_min": float(seq.min()),
           f"{prefix}_seq_max_deviation": float((seq - ideal).abs().max()),
           f"{prefix}_seq_fraction_high": float((seq > high).float().mean())}
    if low is not None:
        out[f"{prefix}_seq_fraction_low"] = float((seq < low).float().mean())
    return out


def is_metrics(weights: torch.Tensor, log_ratio_for_metrics: torch.Tensor,
               mask: torch.Tensor, level: str, threshold: float) -> Dict[str, float]:
    """Statistics of the importance weights before truncation (``weights``: exp of the
    clamped log-ratio, zero on padding; ``log_ratio_for_metrics``: the token log-ratios,
    or the per-row sums [B, 1] at sequence level)."""
    low = 1.0 / threshold
    out: Dict[str, float] = {"rollout_is_mean": float(masked_mean(weights, mask))}
    valid = mask.bool()
    if level == "sequence":  # extremes and fractions in log space, over the rows
        out["rollout_is_max"] = math.exp(min(float(log_ratio_for_metrics.max()), SAFETY_BOUND))
        out["rollout_is_min"] = math.exp(float(log_ratio_for_metrics.min()))
        out["rollout_is_ratio_fraction_high"] = float(
            (log_ratio_for_metrics > math.log(threshold)).float().mean())
        out["rollout_is_ratio_fraction_low"] = float(
            (log_ratio_for_metrics < math.log(low)).float().mean())
    else:
        out["rollout_is_ratio_fraction_high"] = float(masked_mean((weights > threshold).float(),
                                                                  mask))
        out["rollout_is_ratio_fraction_low"] = float(masked_mean((weights < low).float(), mask))
        out["rollout_is_max"] = float(weights.masked_fill(~valid, float("-inf")).max())
        out["rollout_is_min"] = float(weights.masked_fill(~valid, float("inf")).min())
    out["rollout_is_std"] = _std(weights, mask, low, threshold)
    # effective sample size of the weights clamped to [1/threshold, threshold], normalised
    clamped = weights.clamp(min=low, max=threshold)
    normalised = clamped / (masked_mean(clamped, mask) + 1e-8)
    out["rollout_is_eff_sample_size"] = 1.0 / float(masked_mean(normalised.square(), mask))
    seq = masked_mean(weights, mask, axis=-1)
    out.update(_seq_summary("rollout_is", seq, 1.0, threshold, low))
    return out


def rs_metrics(option: str, token_stat: torch.Tensor, seq_stat: Optional[torch.Tensor],
               mask: torch.Tensor, upper: float, lower: Optional[float]) -> Dict[str, float]:
    """Statistics of one rejection criterion: ``token_stat`` [B, T] (at sequence level the
    row's value on each token), ``seq_stat`` [B] (None at token level), its bounds (k1: in
    log space, ``lower`` None for the upper-bound-only criteria)."""
    prefix = f"rollout_rs_{option}"
    valid = mask.bool()
    rows = mask.sum(dim=-1) > 0
    seq = (seq_stat if seq_stat is not None else masked_mean(token_stat, mask, axis=-1))[rows]
    out = {f"{prefix}_mean": float(masked_mean(token_stat, mask))}
    if seq_stat is not None and seq.numel():
        out[f"{prefix}_max"], out[f"{prefix}_min"] = float(seq.max()), float(seq.min())
        high = float((seq > upper).float().mean())
        low = float((seq < lower).float().mean()) if lower is not None else 0.0
    else:
        out[f"{prefix}_max"] = float(token_stat.masked_fill(~valid, float("-inf")).max())
        out[f"{prefix}_min"] = float(token_stat.masked_fill(~valid, float("inf")).min())
        high = float(masked_mean((token_stat > upper).float(), mask))
        low = float(masked_mean((token_stat < lower).float(), mask)) if lower is not None \
            else 0.0
    out[f"{prefix}_fraction_high"], out[f"{prefix}_fraction_low"] = high, low
    out[f"{prefix}_std"] = _std(token_stat, mask, lower if lower is not None else 0.0, upper)
    out.update(_seq_summary(prefix, seq, 0.0, upper, lower))
    if seq.numel() == 0 and lower is not None:
        out[f"{prefix}_seq_fraction_low"] = 0.0
    return out


def offpolicy_metrics(train_log_prob: torch.Tensor, rollout_log_prob: torch.Tensor,
                      mask: torch.Tensor) -> Dict[str, float]:
    """The gap between the trainer's policy and the rollout's, on the sampled tokens: KL
    (direct and k3), per-sequence perplexities and their log difference, chi-squared of the
    token and of the sequence importance ratio."""
    train_mean = masked_mean(train_log_prob, mask, axis=-1)
    rollout_mean = masked_mean(rollout_log_prob, mask, axis=-1)
    log_ratio = train_log_prob - rollout_log_prob
    log_ppl_diff = rollout_mean - train_mean
    safe = torch.clamp(log_ratio, min=-SAFETY_BOUND, max=SAFETY_BOUND)
    seq_sum = torch.clamp((log_ratio * mask).sum(dim=-1), min=-SAFETY_BOUND, max=SAFETY_BOUND)
    return {
        "training_ppl": float(torch.exp(-train_mean).mean()),
        "training_log_ppl": float((-train_mean).mean()),
        "kl": float(masked_mean(-log_ratio, mask)),
        "k3_kl": float(masked_mean(torch.exp(log_ratio) - log_ratio - 1, mask)),
        "rollout_ppl": float(torch.exp(-rollout_mean).mean()),
        "rollout_log_ppl": float((-rollout_mean).mean()),
        "log_ppl_diff": float(log_ppl_diff.mean()),
        "log_ppl_abs_diff": float(log_ppl_diff.abs().mean()),
        "log_ppl_diff_max": float(log_ppl_diff.max()),
        "log_ppl_diff_min": float(log_ppl_diff.min()),
        "ppl_ratio": float(torch.exp(log_ppl_diff).mean()),
        "chi2_token": float(masked_mean(torch.exp(safe).square(), mask) - 1.0),
        "chi2_seq": float(torch.exp(2.0 * seq_sum).mean() - 1.0),
    }
