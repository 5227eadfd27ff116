"""Loss aggregation (``actor.loss_agg_mode``): a per-token loss L [B, R] with mask M to
a scalar.

- ``token-mean``: sum(L M) / sum(M)
- ``seq-mean-token-sum``: mean over non-empty rows of sum_t L M
- ``seq-mean-token-mean``: mean over non-empty rows of (sum_t L M / sum_t M)
- ``seq-mean-token-sum-norm``: sum(L M) / R (Dr. GRPO: a constant horizon R)

Each mode also names the unit it averages over (tokens, non-empty sequences, or none for a
plain sum). The actor uses that unit to weight micro-batches so that gradient accumulation
reproduces the loss of the whole mini-batch exactly, whatever the micro-batch size or
data-parallel split. The built-in modes are the (reduce, units) pairs below, named in
core_algos.names.
"""

from __future__ import annotations

from typing import Callable, Optional, Tuple

import torch

from siirl.dag_worker.core_algos.common import masked_mean, nonempty_rows
from siirl.dag_worker.core_algos.names import AGG_MODES as _AGG_MODES


def register_agg_mode(name: str, units: Optional[Callable] = None):
    """``units(mask) -> count`` is what the mode divides by (None: the mode is a sum)."""
    def decorate(fn: Callable) -> Callable:
        _AGG_MODES.add(name, (fn, units))
        return fn

    return decorate


def _agg_mode(name: str) -> Tuple[Callable, Optional[Callable]]:
    return _AGG_MODES.get(name)


def _tokens(mask):
    return mask.sum()


def _sequences(mask):
    return nonempty_rows(mask).sum()


def _token_mean(loss_mat, mask):
    return masked_mean(loss_mat, mask)


# Fully masked rows (a filtered or empty response) are left out of the sequence mean,
# instead of counting as zero-loss sequences (verl's torch.mean counts them).
def _seq_mean_token_sum(loss_mat, mask):
    rows = nonempty_rows(mask)
    return ((loss_mat * mask).sum(dim=-1) * rows).sum() / rows.sum().clamp_min(1)


def _seq_mean_token_mean(loss_mat, mask):
    rows = nonempty_rows(mask)
    row_means = (loss_mat * mask).sum(dim=-1) / mask.sum(dim=-1).clamp_min(1)
    return (row_means * rows).sum() / rows.sum().clamp_min(1)


# Dr. GRPO: token sums divided by a constant horizon (the padded response length), so
# the per-token weight does not depend on how long the sampled responses were.
def _seq_mean_token_sum_norm(loss_mat, mask):
    return (loss_mat * mask).sum() / mask.shape[-1]


TOKEN_MEAN = (_token_mean, _tokens)
SEQ_MEAN_TOKEN_SUM = (_seq_mean_token_sum, _sequences)
SEQ_MEAN_TOKEN_MEAN = (_seq_mean_token_mean, _sequences)
SEQ_MEAN_TOKEN_SUM_NORM = (_seq_mean_token_sum_norm, None)


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
