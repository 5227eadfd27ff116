"""Critic (value-function) loss.

PPO's clipped value loss (verl / TRL): with v the new predictions, v_old the values of
the rollout and c = cliprange_value,
    v_clip = clip(v, v_old - c, v_old + c)
    loss = 0.5 * agg(max((v - R)^2, (v_clip - R)^2))
so the critic gains nothing from moving a prediction more than c away from its rollout
value. vf_clipfrac is the token share where the clipped term is strictly larger.
"""

from __future__ import annotations

import torch

from siirl.dag_worker.core_algos.common import masked_mean
from siirl.dag_worker.core_algos.loss_aggregation import agg_loss


def compute_value_loss(vpreds: torch.Tensor, returns: torch.Tensor, values: torch.Tensor,
                       response_mask: torch.Tensor, cliprange_value: float,
                       loss_agg_mode: str = "token-mean"):
    """-> (vf_loss, vf_clipfrac); see the module doc."""
    mask = response_mask.to(vpreds.dtype)
    vpred_clipped = torch.clamp(vpreds, values - cliprange_value, values + cliprange_value)
    losses_unclipped = (vpreds - returns) ** 2
    losses_clipped = (vpred_clipped - returns) ** 2
    vf_loss = 0.5 * agg_loss(torch.maximum(losses_unclipped, losses_clipped), mask,
                             loss_agg_mode)
    vf_clipfrac = masked_mean(torch.gt(losses_clipped, losses_unclipped).to(mask.dtype), mask)
    return vf_loss, vf_clipfrac
