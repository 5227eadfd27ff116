"""Advantage estimators, chosen by ``algorithm.adv_estimator``.

The built-in estimators are named in ``core_algos.names`` (read without importing torch);
``register_adv_est(name)`` adds one; ``get_adv_estimator_fn(name)`` returns it, or raises
ConfigError listing the registered names. An estimator takes tensors shaped
``[B, R]`` (and, for the group estimators, ``index``: the prompt ``uid`` of each row)
and returns ``(advantages, returns)``, both ``[B, R]``. The DAG worker calls it with the
arguments its signature names (see ``dag_utils.call_with_available``).

Statistics over the whole batch (whitening, GPG's alpha, CPGD's B / m) take the estimator's
``reduction`` (``batch_reduction``): the default adds up the rows given; the advantage node
passes one over every worker's rows, so N workers compute what one would. Group statistics
need no reduction: a prompt's samples are always on one worker (the rollout repeats a
prompt where it is, the DataBuffer moves whole groups, and the advantage node checks).
B counts the rows with at least one response token: a row that trains nothing (padding
that evens out workers' row counts, a group filtered out of the loss) is not in the batch.

Outcome estimators score each response once, s_i = sum_t r_{i,t}, and broadcast the
advantage over its response tokens. With g the group (same uid) of row i, n = |g|:

- ``grpo`` / ``gspo``: (s_i - mean_g) / (std_g + eps), std unbiased; without the
  division when ``norm_adv_by_std_in_grpo`` is False. GSPO only changes the policy loss.
- ``drgrpo``: s_i - mean_g (Dr. GRPO, arXiv 2503.20783); its matching loss aggregation
  is ``actor.loss_agg_mode=seq-mean-token-sum-norm``.
- ``cpgd`` (siiRL): s_i - mean_g, weighted by ``weight_factor_in_cpgd``:
  ``STD_weight`` 1 / (std_g + eps); ``clip_filter_like_weight`` min(B / m, 3) with m the
  number of groups (with a response token) whose std is not 0; ``naive`` 1.
- ``rloo``: s_i * n/(n-1) - mean_g * n/(n-1) = s_i - (mean of the other n-1 scores).
- ``reinforce_plus_plus_baseline``: s_i - mean_g on every response token, then whitened
  over all response tokens of the batch.
- ``opo``: s_i - sum_g(len_j s_j) / sum_g(len_j) (length-weighted baseline).
- ``grpo_passk``: only the best response of a group gets r_max - r_second (divided by
  std_g + eps when normalising); groups need at least 2 responses.
- ``gpg``: (B / #(s != 0)) * (s_i - mean_g) / f_norm, both counts over the rows in B.
- ``remax`` (ReMax, arXiv 2310.10505): the reward-to-go of each token minus the score of a
  greedy response to the same prompt (``reward_baselines``, one per row, which the
  ``remax`` pipeline's baseline nodes write); with an outcome score that is s_i - b_i on
  every response token. Returns are the rewards-to-go. No group statistics.

Groups of one (as in verl): mean 0 and std 1, so GRPO gives s/(1 + eps), Dr. GRPO, RLOO,
REINFORCE++-baseline, CPGD-naive give s itself, CPGD-STD s/(1 + eps).

Token-level estimators:

- ``gae``: delta_t = r_t + gamma V_{t+1} - V_t, A_t = delta_t + gamma lam A_{t+1},
  computed right to left; returns = A + V; A is then whitened over the response mask.
- ``gae_marft``: GAE over several agents' responses taken as one sequence (MARFT), whitened
  per agent.
- ``reinforce_plus_plus``: G_t = r_t + gamma G_{t+1}, whitened over the response mask.
"""

from __future__ import annotations

from typing import Any, Callable, Optional

import torch

from siirl.dag_worker.core_algos.batch_reduction import LOCAL, BatchReduction
from siirl.dag_worker.core_algos.common import (
    group_mean_std,
    group_rows,
    masked_whiten,
    nonempty_rows,
)
from siirl.dag_worker.core_algos.names import ADV_ESTIMATORS as _ADV_ESTIMATORS
from siirl.dag_worker.core_algos.names import CPGD_WEIGHTS as _CPGD_WEIGHTS
from siirl.errors import ConfigError


def register_adv_est(*names: Any) -> Callable[[Callable], Callable]:
    """Register an estimator under one or more names (strings or enum members)."""
    return _ADV_ESTIMATORS.register(*(getattr(name, "value", name) for name in names))


def get_adv_estimator_fn(name: Any) -> Callable:
    return _ADV_ESTIMATORS.get(name)


def registered_adv_estimators() -> list:
    return _ADV_ESTIMATORS.names()


def _broadcast(per_row: torch.Tensor, response_mask: torch.Tensor):
    advantages = per_row.unsqueeze(-1) * response_mask
    return advantages, advantages


# ---- group-relative outcome estimators -------------------------------------------------

def compute_grpo_outcome_advantage(token_level_rewards: torch.Tensor,
                                   response_mask: torch.Tensor, index: Any,
                                   epsilon: float = 1e-6,
                                   norm_adv_by_std_in_grpo: bool = True):
    """Outcome score minus its group mean, divided by the group std (unbiased) + epsilon
    when ``norm_adv_by_std_in_grpo``. A group of one has mean 0 and std 1."""
    with torch.no_grad():
        scores = token_level_rewards.sum(dim=-1)
        advantages = torch.empty_like(scores)
        for rows in group_rows(index, scores.shape[0]).values():
            mean, std = group_mean_std(scores, rows)
            centred = scores[rows] - mean
            advantages[rows] = centred / (std + epsilon) if norm_adv_by_std_in_grpo else centred
        return _broadcast(advantages, response_mask)


def compute_drgrpo_outcome_advantage(token_level_rewards: torch.Tensor,
                                     response_mask: torch.Tensor, index: Any,
                                     epsilon: float = 1e-6):
    """Dr. GRPO: GRPO without the std division (pair with loss_agg_mode
    ``seq-mean-token-sum-norm``, which removes GRPO's length normalisation)."""
    return compute_grpo_outcome_advantage(token_level_rewards, response_mask, index,
                                          epsilon=epsilon, norm_adv_by_std_in_grpo=False)


# CPGD's weight factors (named in core_algos.names):
# fn(centred, std, epsilon, batch_size, spread_groups) -> advantage
def cpgd_std_weight(centred, std, epsilon, batch_size, spread_groups):
    return centred / (std + epsilon)


def cpgd_clip_filter_like_weight(centred, std, epsilon, batch_size, spread_groups):
    # siiRL: (B / #groups with non-zero std) clamped at 3; with no such group B/0 = inf
    # clamps to 3 (the centred scores are all 0 then anyway).
    weight = 3.0 if spread_groups == 0 else min(batch_size / spread_groups, 3.0)
    return centred * weight


def cpgd_naive(centred, std, epsilon, batch_size, spread_groups):
    return centred


def compute_cpgd_outcome_advantage(token_level_rewards: torch.Tensor,
                                   response_mask: torch.Tensor, index: Any,
                                   epsilon: float = 1e-6,
                                   weight_factor_in_cpgd: str = "STD_weight",
                                   reduction: BatchReduction = LOCAL):
    """siiRL's CPGD advantage: group-centred outcome score times a weight factor
    (``STD_weight``, ``clip_filter_like_weight`` or ``naive``; see the module doc)."""
    weigh = _CPGD_WEIGHTS.get(weight_factor_in_cpgd)
    with torch.no_grad():
        scores = token_level_rewards.sum(dim=-1)
        groups = group_rows(index, scores.shape[0])
        stats = {key: group_mean_std(scores, rows) for key, rows in groups.items()}
        in_batch = nonempty_rows(response_mask)
        # singletons have std 1, so they count as spread groups (as in siiRL)
        spread = sum(1 for key, rows in groups.items()
                     if stats[key][1].item() != 0 and in_batch[rows].any())
        batch_size, spread_groups = (int(v) for v in reduction.sum([in_batch.sum(), spread]))
        advantages = torch.empty_like(scores)
        for key, rows in groups.items():
            mean, std = stats[key]
            advantages[rows] = weigh(scores[rows] - mean, std, epsilon, batch_size,
                                     spread_groups)
        return _broadcast(advantages, response_mask)


def compute_rloo_outcome_advantage(token_level_rewards: torch.Tensor,
                                   response_mask: torch.Tensor, index: Any,
                                   epsilon: float = 1e-6):
    """REINFORCE leave-one-out (arXiv 2402.14740): score minus the mean of the other
    responses of its group, computed as s * n/(n-1) - mean * n/(n-1) like verl. A group
    of one keeps its raw score."""
    with torch.no_grad():
        scores = token_level_rewards.sum(dim=-1)
        advantages = scores.clone()
        for rows in group_rows(index, scores.shape[0]).values():
            n = len(rows)
            if n > 1:
                factor = n / (n - 1)
                advantages[rows] = scores[rows] * factor - scores[rows].mean() * factor
        return _broadcast(advantages, response_mask)


def compute_reinforce_plus_plus_baseline_outcome_advantage(token_level_rewards: torch.Tensor,
                                                           response_mask: torch.Tensor,
                                                           index: Any,
                                                           epsilon: float = 1e-6,
                                                           reduction: BatchReduction = LOCAL):
    """REINFORCE++ with baseline (arXiv 2501.03262): group-centred score on every response
    token, whitened over all response tokens of the batch (so longer responses weigh more
    in the batch statistics, as in verl)."""
    with torch.no_grad():
        scores = token_level_rewards.sum(dim=-1)
        centred = torch.empty_like(scores)
        for rows in group_rows(index, scores.shape[0]).values():
            mean, _ = group_mean_std(scores, rows)
            centred[rows] = scores[rows] - mean
        tiled = centred.unsqueeze(-1) * response_mask
        advantages = masked_whiten(tiled, response_mask, reduction=reduction) * response_mask
        return advantages, advantages


def compute_opo_outcome_advantage(token_level_rewards: torch.Tensor,
                                  response_mask: torch.Tensor, index: Any,
                                  epsilon: float = 1e-6):
    """OPO (arXiv 2505.23585): score minus the length-weighted group mean score; a group
    of one has baseline 0."""
    with torch.no_grad():
        scores = token_level_rewards.sum(dim=-1)
        lengths = response_mask.sum(dim=-1).to(scores.dtype)
        advantages = scores.clone()
        for rows in group_rows(index, scores.shape[0]).values():
            if len(rows) > 1:
                weights = lengths[rows]
                # clamp: a group of empty responses has baseline 0, not nan
                baseline = (weights * scores[rows]).sum() / weights.sum().clamp_min(1)
                advantages[rows] = scores[rows] - baseline
        return _broadcast(advantages, response_mask)


def compute_grpo_passk_outcome_advantage(token_level_rewards: torch.Tensor,
                                         response_mask: torch.Tensor, index: Any,
                                         epsilon: float = 1e-6,
                                         norm_adv_by_std_in_grpo: bool = True):
    """Pass@k GRPO (arXiv 2503.19595): in each group only the best response gets an
    advantage, r_max - r_second_max (divided by std_g + eps when normalising)."""
    with torch.no_grad():
        scores = token_level_rewards.sum(dim=-1)
        advantages = torch.zeros_like(scores)
        for key, rows in group_rows(index, scores.shape[0]).items():
            if len(rows) < 2:
                raise ConfigError(f"adv_estimator=grpo_passk needs at least 2 responses per "
                                  f"prompt (rollout.n >= 2); group {key!r} has {len(rows)}")
            group = scores[rows]
            top, top_idx = torch.topk(group, 2)
            advantage = top[0] - top[1]
            if norm_adv_by_std_in_grpo:
                advantage = advantage / (group.std() + epsilon)
            advantages[rows[int(top_idx[0])]] = advantage
        return _broadcast(advantages, response_mask)


def compute_gpg_outcome_advantage(token_level_rewards: torch.Tensor,
                                  response_mask: torch.Tensor, index: Any,
                                  epsilon: float = 1e-6, f_norm: float = 1.0,
                                  reduction: BatchReduction = LOCAL):
    """GPG (arXiv 2504.02546): alpha * (s - mean_g) / f_norm with alpha = B / #(s != 0),
    B over the batch's rows with a response token, #(s != 0) (at least 1) among them."""
    with torch.no_grad():
        scores = token_level_rewards.sum(dim=-1)
        in_batch = nonempty_rows(response_mask).bool()
        rows, nonzero = reduction.sum([in_batch.sum(),
                                       torch.count_nonzero(scores[in_batch])])
        alpha = float(rows) / max(float(nonzero), 1.0)
        advantages = torch.empty_like(scores)
        for rows in group_rows(index, scores.shape[0]).values():
            mean, _ = group_mean_std(scores, rows)
            advantages[rows] = alpha * (scores[rows] - mean) / f_norm
        return _broadcast(advantages, response_mask)


def compute_remax_outcome_advantage(token_level_rewards: torch.Tensor,
                                    reward_baselines: torch.Tensor,
                                    response_mask: torch.Tensor):
    """ReMax: returns = rewards-to-go over the response; advantages = returns minus the
    row's greedy-baseline score on every response token (verl's semantics)."""
    with torch.no_grad():
        masked = token_level_rewards * response_mask
        returns = masked.flip(dims=[-1]).cumsum(dim=-1).flip(dims=[-1])
        baselines = reward_baselines.to(returns.dtype).reshape(-1, 1)
        return returns - baselines * response_mask, returns


# ---- token-level estimators ------------------------------------------------------------

def compute_gae_advantage_return(token_level_rewards: torch.Tensor, values: torch.Tensor,
                                 response_mask: torch.Tensor, gamma: float, lam: float,
                                 reduction: BatchReduction = LOCAL):
    """Generalised advantage estimation (verl's semantics), right to left over tokens.

    A masked position (padding, or an observation/tool token in the middle of a
    response) neither adds a TD error nor breaks the recursion: both the running
    advantage and the next value carry across it unchanged, so the last response token
    before a hole bootstraps from the first response token after it. Rows are
    independent, so shorter rows in a batch are unaffected by longer ones.
    ``returns = advantages + values`` (before whitening); the advantages are then
    whitened over the response mask and zeroed at masked positions (verl leaves the
    whitened carried value there; no loss reads it).
    """
    with torch.no_grad():
        advantages = _raw_gae(token_level_rewards, values, response_mask, gamma, lam)
        returns = advantages + values
        advantages = masked_whiten(advantages, response_mask, reduction=reduction) \
            * response_mask
    return advantages, returns


def _raw_gae(token_level_rewards, values, response_mask, gamma: float, lam: float):
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
    return torch.stack(reversed_adv[::-1], dim=1)


def compute_marft_gae_advantage_return(token_level_rewards, values, response_mask,
                                       gamma: float, lam: float,
                                       reduction: BatchReduction = LOCAL):
    """MARFT's GAE for agents acting in turn (Reasoner, then Actor, ...) within one episode.

    Each argument is a list with one ``[B, R_g]`` tensor per agent, in acting order (a
    single tensor is one agent: then this is ``gae``). The agents' response tokens form one
    sequence per row: agent g's last token bootstraps from agent g+1's first token value,
    the last agent's last token from 0, so an early agent's advantage carries the later
    agents' rewards and values. Returns ``(advantages, returns)`` as lists per agent (a pair
    of tensors for a single tensor); advantages are whitened per agent over its mask.
    """
    if isinstance(token_level_rewards, torch.Tensor):
        return compute_gae_advantage_return(token_level_rewards, values, response_mask,
                                            gamma, lam, reduction)
    widths = [r.shape[1] for r in token_level_rewards]
    with torch.no_grad():
        joint = _raw_gae(torch.cat(list(token_level_rewards), dim=1),
                         torch.cat(list(values), dim=1),
                         torch.cat(list(response_mask), dim=1), gamma, lam)
        advantages, returns = [], []
        for part, value, mask in zip(torch.split(joint, widths, dim=1), values, response_mask,
                                     strict=True):
            returns.append(part + value)
            advantages.append(masked_whiten(part, mask, reduction=reduction) * mask)
    return advantages, returns


def compute_reinforce_plus_plus_outcome_advantage(token_level_rewards: torch.Tensor,
                                                  response_mask: torch.Tensor,
                                                  gamma: Optional[float] = 1.0,
                                                  reduction: BatchReduction = LOCAL):
    """REINFORCE++ (arXiv 2501.03262): discounted return G_t = r_t + gamma G_{t+1},
    whitened over the response mask.

    As in verl the running return is reset to 0 at every masked position, so a return
    never sums rewards across padding (or across a hole in the middle of a response).
    ``returns`` are the raw discounted returns.
    """
    gamma = 1.0 if gamma is None else gamma
    with torch.no_grad():
        returns = torch.zeros_like(token_level_rewards)
        running = torch.zeros_like(token_level_rewards[:, 0])
        for t in reversed(range(token_level_rewards.shape[1])):
            running = token_level_rewards[:, t] + gamma * running
            returns[:, t] = running
            running = running * response_mask[:, t]
        advantages = masked_whiten(returns, response_mask, reduction=reduction) \
            * response_mask
    return advantages, returns
