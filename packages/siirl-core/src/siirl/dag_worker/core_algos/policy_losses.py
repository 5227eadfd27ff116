"""Policy losses (by ``actor.policy_loss.loss_mode``) and entropy; each policy loss ends
with the aggregation ``actor.loss_agg_mode`` names (``loss_aggregation``).

Policy losses share the signature ``fn(old_log_prob, log_prob, advantages,
response_mask, loss_agg_mode, config) -> (pg_loss, pg_clipfrac, ppo_kl,
pg_clipfrac_lower)``; ``config`` is the actor config (``ActorArguments``; None means its
defaults, a dict or DictConfig is typed first) with clip_ratio_low/high, clip_ratio_c and
policy_loss.*.
With r = exp(log_prob - old_log_prob), A the advantage, eps_l/eps_h the clip ratios:

- ``vanilla``: max(-A r, -A clip(r, 1-eps_l, 1+eps_h)), and for A < 0 at most
  -A clip_ratio_c (dual clip). Log-ratio clamped to [-20, 20].
- ``gspo`` (arXiv 2507.18071): sequence ratio s_i = exp(masked mean_t log r); per token
  s_it = exp(sg(log s_i) + log_prob - sg(log_prob)) (value s_i, gradient of the token's
  log-prob), log clamped at 10; loss max(-A s_it, -A clip(s_it, 1-eps_l, 1+eps_h)).
- ``cpgd`` (siiRL): -A * clip(log_prob), the log-prob itself clipped to
  <= old + log(1+eps_h) where A > 0 and >= old + log(1-eps_l) elsewhere.
- ``gpg``: -A log_prob.
- ``clip_cov`` (arXiv 2505.22617): the vanilla clipped loss (no dual clip) with the
  gradient removed from a random clip_cov_ratio share of tokens whose centred
  covariance (A - mean A)(log_prob - mean log_prob) lies in (clip_cov_lb, clip_cov_ub)
  and which the ratio clip did not already clip.
- ``kl_cov``: -A r, plus ppo_kl_coef |log r| on the kl_cov_ratio share of tokens with
  the largest covariance; ppo_kl reports mean |log r|.
- ``geo_mean`` (GMPO, arXiv 2507.20673): per sequence, exp(mean_t sgn(A) min(sgn(A)
  log r, sgn(A) clip(log r, -eps_l, eps_h))) times the mean token advantage, negated,
  averaged over non-empty sequences (loss_agg_mode is not used).

Metrics are token means over the mask unless stated; losses that have no clip report 0.
"""

from __future__ import annotations

import math
from typing import Any, Callable, Optional, Tuple

import torch

from siirl.dag_worker.core_algos.common import masked_mean, nonempty_rows
from siirl.dag_worker.core_algos.loss_aggregation import agg_loss
from siirl.dag_worker.core_algos.names import POLICY_LOSSES as _POLICY_LOSSES
from siirl.errors import ConfigError
from siirl.params import ActorArguments
from siirl.params.typed import to_section

# ---- policy losses -------------------------------------------------------------------

def register_policy_loss(name: str) -> Callable[[Callable], Callable]:
    """Register ``fn(old_log_prob, log_prob, advantages, response_mask, loss_agg_mode,
    config) -> (pg_loss, pg_clipfrac, ppo_kl, pg_clipfrac_lower)`` under ``name``."""
    return _POLICY_LOSSES.register(name)


def get_policy_loss_fn(name: str) -> Callable:
    return _POLICY_LOSSES.get(name)


def registered_policy_losses() -> list:
    return _POLICY_LOSSES.names()


def _actor(config: Any) -> ActorArguments:
    """The actor settings a loss reads (the engine hands them typed). A dict or DictConfig
    that sets clip_ratio but not clip_ratio_low/high clips at clip_ratio on both sides."""
    if isinstance(config, ActorArguments):
        return config
    if config is not None and "clip_ratio" in config:
        config = {"clip_ratio_low": config["clip_ratio"],
                  "clip_ratio_high": config["clip_ratio"], **config}
    return to_section(ActorArguments, config)


def _clip_ratios(config: Any) -> Tuple[float, float]:
    """(clip_ratio_low, clip_ratio_high)."""
    actor = _actor(config)
    return actor.clip_ratio_low, actor.clip_ratio_high


def _dual_clip_c(config: Any) -> float:
    clip_ratio_c = _actor(config).clip_ratio_c
    if not clip_ratio_c > 1.0:
        raise ConfigError(f"actor_rollout_ref.actor.clip_ratio_c must be > 1.0 for dual-clip "
                          f"PPO, got {clip_ratio_c}")
    return clip_ratio_c


def _zero(like: torch.Tensor) -> torch.Tensor:
    return torch.zeros((), dtype=like.dtype, device=like.device)


def tis_weights(old_log_prob: torch.Tensor, rollout_log_probs: torch.Tensor,
                cap: float) -> torch.Tensor:
    """Truncated importance weights min(exp(old - rollout), cap), no gradient: the trainer's
    old policy against the inference engine that sampled (verl's ``tis_imp_ratio_cap``)."""
    log_ratio = torch.clamp(old_log_prob - rollout_log_probs, min=-20.0, max=20.0)
    return torch.exp(log_ratio).clamp(max=cap).detach()


def compute_policy_loss_vanilla(old_log_prob: torch.Tensor, log_prob: torch.Tensor,
                                advantages: torch.Tensor, response_mask: torch.Tensor,
                                loss_agg_mode: str = "token-mean", config: Any = None,
                                rollout_log_probs: Optional[torch.Tensor] = None):
    """PPO clipped surrogate with asymmetric clip range and dual clip (verl's definition).

    ratio = exp(log_prob - old_log_prob) (log-ratio clamped to [-20, 20] so exp cannot
    overflow); loss = max(-A*ratio, -A*clip(ratio, 1-low, 1+high)), and for A < 0 the
    loss is further capped at -A*clip_ratio_c (dual clip: a huge ratio on a negative
    advantage cannot dominate the update). Clip fractions and ppo_kl are token means.
    With ``rollout_log_probs`` and ``tis_imp_ratio_cap`` > 0, each token's loss is
    multiplied by its truncated importance weight (``tis_weights``).
    """
    low, high = _clip_ratios(config)
    clip_ratio_c = _dual_clip_c(config)
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
    cap = float(_actor(config).tis_imp_ratio_cap or -1.0)
    if rollout_log_probs is not None and cap > 0:
        pg_losses = pg_losses * tis_weights(old_log_prob, rollout_log_probs, cap)
    pg_loss = agg_loss(pg_losses, mask, loss_agg_mode)
    return pg_loss, pg_clipfrac, ppo_kl, pg_clipfrac_lower


def compute_policy_loss_gspo(old_log_prob: torch.Tensor, log_prob: torch.Tensor,
                             advantages: torch.Tensor, response_mask: torch.Tensor,
                             loss_agg_mode: str = "seq-mean-token-mean", config: Any = None):
    """GSPO: clipped surrogate on the sequence-level importance ratio (see module doc).

    verl always aggregates GSPO with seq-mean-token-mean; here ``loss_agg_mode`` is
    honoured (default seq-mean-token-mean) so that the actor's exact micro-batch
    weighting, which uses the configured mode's units, stays exact. Set
    ``actor.loss_agg_mode=seq-mean-token-mean`` for the paper's aggregation.
    pg_clipfrac_lower is 0 (no dual clip).
    """
    low, high = _clip_ratios(config)
    mask = response_mask.to(log_prob.dtype)
    neg_approx_kl = log_prob - old_log_prob
    seq_lengths = mask.sum(dim=-1).clamp_min(1)
    seq_log_ratio = (neg_approx_kl * mask).sum(dim=-1) / seq_lengths
    # value of the sequence ratio, gradient through each token's own log-prob
    log_ratio = log_prob - log_prob.detach() + seq_log_ratio.detach().unsqueeze(-1)
    ratio = torch.exp(torch.clamp(log_ratio, max=10.0))

    losses_unclipped = -advantages * ratio
    losses_clipped = -advantages * torch.clamp(ratio, 1.0 - low, 1.0 + high)
    pg_losses = torch.maximum(losses_unclipped, losses_clipped)
    pg_loss = agg_loss(pg_losses, mask, loss_agg_mode)
    pg_clipfrac = masked_mean(torch.gt(losses_clipped, losses_unclipped).to(mask.dtype), mask)
    ppo_kl = masked_mean(-neg_approx_kl, mask)
    return pg_loss, pg_clipfrac, ppo_kl, _zero(pg_loss)


def compute_policy_loss_cpgd(old_log_prob: torch.Tensor, log_prob: torch.Tensor,
                             advantages: torch.Tensor, response_mask: torch.Tensor,
                             loss_agg_mode: str = "token-mean", config: Any = None):
    """siiRL's CPGD loss: -A * log_prob with log_prob clipped (not the ratio).

    Where A > 0 the log-prob is capped at old + log(1 + high), elsewhere floored at
    old + log(1 - low): the gradient vanishes once the ratio leaves the trust region in
    the direction the advantage pushes. pg_clipfrac counts tokens with ratio > 1 + high
    (A > 0) or ratio < 1 - low (A <= 0); pg_clipfrac_lower counts ratio > clip_ratio_c
    with A < 0 (a metric only). The log-ratio is not clamped here (as in siiRL).
    """
    low, high = _clip_ratios(config)
    clip_ratio_c = _dual_clip_c(config)
    mask = response_mask.to(log_prob.dtype)
    neg_approx_kl = log_prob - old_log_prob
    ratio = torch.exp(neg_approx_kl)
    ppo_kl = masked_mean(-neg_approx_kl, mask)

    positive = advantages > 0
    clipped_log_prob = torch.where(
        positive,
        torch.clamp(log_prob, max=math.log(1 + high) + old_log_prob),
        torch.clamp(log_prob, min=math.log(1 - low) + old_log_prob))
    pg_losses = -clipped_log_prob * advantages
    pg_loss = agg_loss(pg_losses, mask, loss_agg_mode)

    is_clipped = torch.where(positive, ratio > 1 + high, ratio < 1 - low)
    pg_clipfrac = masked_mean(is_clipped.to(mask.dtype), mask).detach()
    lower = (ratio > clip_ratio_c) & (advantages < 0)
    pg_clipfrac_lower = masked_mean(lower.to(mask.dtype), mask).detach()
    return pg_loss, pg_clipfrac, ppo_kl, pg_clipfrac_lower


def compute_policy_loss_gpg(old_log_prob: torch.Tensor, log_prob: torch.Tensor,
                            advantages: torch.Tensor, response_mask: torch.Tensor,
                            loss_agg_mode: str = "token-mean", config: Any = None):
    """GPG: plain policy gradient -A * log_prob (no ratio, no clip); metrics are 0."""
    mask = response_mask.to(log_prob.dtype)
    pg_loss = agg_loss(-log_prob * advantages, mask, loss_agg_mode)
    zero = _zero(pg_loss)
    return pg_loss, zero, zero, zero


def compute_policy_loss_clip_cov(old_log_prob: torch.Tensor, log_prob: torch.Tensor,
                                 advantages: torch.Tensor, response_mask: torch.Tensor,
                                 loss_agg_mode: str = "token-mean", config: Any = None):
    """Clip-Cov (verl's definition; see module doc).

    Reads policy_loss.clip_cov_ratio (default 0.0002), clip_cov_lb (1.0), clip_cov_ub
    (5.0). At most max(int(ratio * #tokens), 1) candidates are detached, chosen at random
    (``torch.randperm`` on the global RNG) when there are more. pg_clipfrac is the share of
    detached tokens; pg_clipfrac_lower is 0. No log-ratio clamp and no dual clip.
    """
    policy = _actor(config).policy_loss
    clip_cov_ratio, clip_cov_lb = policy.clip_cov_ratio, policy.clip_cov_lb
    clip_cov_ub = policy.clip_cov_ub
    if not clip_cov_ratio > 0:
        raise ConfigError(f"actor_rollout_ref.actor.policy_loss.clip_cov_ratio must be > 0, "
                          f"got {clip_cov_ratio}")
    low, high = _clip_ratios(config)
    mask = response_mask.to(log_prob.dtype)
    neg_approx_kl = log_prob - old_log_prob
    ratio = torch.exp(neg_approx_kl)
    ppo_kl = masked_mean(-neg_approx_kl, mask)

    losses_unclipped = -advantages * ratio
    losses_clipped = -advantages * torch.clamp(ratio, 1.0 - low, 1.0 + high)
    with torch.no_grad():  # token selection only; no gradient flows through it
        valid = mask > 0
        clipped_by_ratio = (losses_clipped > losses_unclipped) & valid
        cov = ((advantages - masked_mean(advantages, mask))
               * (log_prob - masked_mean(log_prob, mask)))
        cov = cov.masked_fill(~valid | clipped_by_ratio, -torch.inf)
        clip_num = max(int(clip_cov_ratio * mask.sum().item()), 1)
        candidates = torch.nonzero((cov < clip_cov_ub) & (cov > clip_cov_lb) & valid)
        if len(candidates) > 0:  # permuted even when all are kept: same RNG use as verl
            candidates = candidates[torch.randperm(len(candidates))[:clip_num]]
        corr = torch.ones_like(advantages)
        corr[candidates[:, 0], candidates[:, 1]] = 0
    pg_clipfrac = masked_mean((corr == 0).to(mask.dtype), mask)
    pg_losses = torch.maximum(losses_unclipped, losses_clipped) * corr
    pg_loss = agg_loss(pg_losses, mask, loss_agg_mode)
    return pg_loss, pg_clipfrac, ppo_kl, _zero(pg_loss)


def compute_policy_loss_kl_cov(old_log_prob: torch.Tensor, log_prob: torch.Tensor,
                               advantages: torch.Tensor, response_mask: torch.Tensor,
                               loss_agg_mode: str = "token-mean", config: Any = None):
    """KL-Cov (verl's definition; see module doc).

    Reads policy_loss.kl_cov_ratio (default 0.0002) and policy_loss.ppo_kl_coef (default
    0.1, the schema's: what a configured run always read). The
    max(int(ratio * #tokens), 1) valid tokens with the largest centred covariance
    (A - mean A)(log_prob - mean log_prob), means over valid tokens, get the extra
    ppo_kl_coef * |log_prob - old_log_prob| term. Returns (loss, 0, mean |log r|, 0).
    """
    policy = _actor(config).policy_loss
    kl_cov_ratio, ppo_kl_coef = policy.kl_cov_ratio, policy.ppo_kl_coef
    if not kl_cov_ratio > 0:
        raise ConfigError(f"actor_rollout_ref.actor.policy_loss.kl_cov_ratio must be > 0, "
                          f"got {kl_cov_ratio}")
    mask = response_mask.to(log_prob.dtype)
    neg_approx_kl = log_prob - old_log_prob
    abs_kl = neg_approx_kl.abs()
    ratio = torch.exp(neg_approx_kl)
    ppo_kl_abs = masked_mean(abs_kl, mask)
    pg_losses = -advantages * ratio
    with torch.no_grad():
        valid = (mask > 0).reshape(-1)
        valid_idx = torch.nonzero(valid, as_tuple=True)[0]
        selected = torch.zeros_like(valid)
        if len(valid_idx) > 0:
            adv = advantages.detach().reshape(-1)[valid_idx]
            logp = log_prob.detach().reshape(-1)[valid_idx]
            cov = (adv - adv.mean()) * (logp - logp.mean())
            k = max(1, int(len(cov) * kl_cov_ratio))
            selected[valid_idx[torch.topk(cov, k, largest=True).indices]] = True
        selected = selected.reshape(mask.shape)
    pg_losses = torch.where(selected, pg_losses + ppo_kl_coef * abs_kl, pg_losses)
    pg_loss = agg_loss(pg_losses, mask, loss_agg_mode)
    zero = _zero(pg_loss)
    return pg_loss, zero, ppo_kl_abs, zero


def compute_policy_loss_geo_mean(old_log_prob: torch.Tensor, log_prob: torch.Tensor,
                                 advantages: torch.Tensor, response_mask: torch.Tensor,
                                 loss_agg_mode: str = "token-mean", config: Any = None):
    """GMPO: geometric mean of token ratios per sequence, with token-level clipping in log
    space (see module doc). Sequence means divide by the exact token count (verl adds
    1e-8) and the loss averages over non-empty sequences (verl's torch.mean also counts
    empty rows, whose loss is 0); with a ``seq-mean-*`` loss_agg_mode the actor's
    micro-batch weighting is then exact. pg_clipfrac / pg_clipfrac_lower are the shares
    of tokens whose log-ratio was clipped with A > 0 / A < 0.
    """
    low, high = _clip_ratios(config)
    mask = response_mask.to(log_prob.dtype)
    neg_approx_kl = log_prob - old_log_prob
    ppo_kl = masked_mean(-neg_approx_kl, mask)

    sign = torch.sign(advantages)
    clamped = torch.clamp(neg_approx_kl, -low, high)
    # pessimistic choice per token: the clipped log-ratio only when it lowers the objective
    chosen = sign * torch.minimum(sign * neg_approx_kl, sign * clamped)
    lengths = mask.sum(dim=-1).clamp_min(1)
    seq_ratio = torch.exp((chosen * mask).sum(dim=-1) / lengths)
    seq_advantage = (advantages * mask).sum(dim=-1) / lengths
    rows = nonempty_rows(mask)
    pg_loss = (-seq_advantage * seq_ratio * rows).sum() / rows.sum().clamp_min(1)

    clipped = torch.ne(neg_approx_kl, clamped).to(mask.dtype)
    pg_clipfrac = masked_mean(clipped * (advantages > 0).to(mask.dtype), mask)
    pg_clipfrac_lower = masked_mean(clipped * (advantages < 0).to(mask.dtype), mask)
    return pg_loss, pg_clipfrac, ppo_kl, pg_clipfrac_lower


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
