"""Masked statistics and prompt grouping shared by the estimators and losses.

``masked_mean`` divides by the exact count of selected entries (an empty mask gives 0);
verl adds 1e-8 to the count instead, a relative change of about 1e-8 / count.
``masked_whiten`` is verl's: (x - mean) * rsqrt(var + 1e-8) with the unbiased masked
variance var = mean((x - mean)^2) * n / (n - 1), computed in that order, in float64, over
the whole batch (its ``reduction`` adds up every worker's rows; see ``batch_reduction``).
"""

from __future__ import annotations

from typing import Any, Dict, List, Sequence, Tuple

import torch

from siirl.dag_worker.core_algos.batch_reduction import LOCAL, BatchReduction
from siirl.errors import DataError


def masked_mean(values: torch.Tensor, mask: torch.Tensor, axis: Any = None) -> torch.Tensor:
    """Mean of ``values`` where ``mask`` is 1 (over ``axis``, or all entries); 0 if none."""
    if axis is None:
        return (values * mask).sum() / mask.sum().clamp_min(1)
    return (values * mask).sum(dim=axis) / mask.sum(dim=axis).clamp_min(1)


def masked_var(values: torch.Tensor, mask: torch.Tensor, unbiased: bool = True) -> torch.Tensor:
    """Variance over the masked entries; with fewer than two entries the Bessel factor is
    taken as 1 (verl raises there), so one token has variance 0."""
    centered = values - masked_mean(values, mask)
    variance = masked_mean(centered.pow(2), mask)
    if unbiased:
        count = mask.sum()
        if count > 1:
            variance = variance * (count / (count - 1))
    return variance


def masked_whiten(values: torch.Tensor, mask: torch.Tensor, shift_mean: bool = True,
                  eps: float = 1e-8, reduction: BatchReduction = LOCAL) -> torch.Tensor:
    """Normalise to zero mean, unit variance over the masked entries of the whole batch
    (unbiased variance; two passes, mean first, each a sum over all workers)."""
    x, m = values.to(torch.float64), mask.to(torch.float64)
    total, count = reduction.sum([(x * m).sum(), m.sum()])
    mean = total / count.clamp_min(1)
    (squares,) = reduction.sum([((x - mean).pow(2) * m).sum()])
    variance = squares / count.clamp_min(1)
    if count > 1:  # one token: Bessel's factor taken as 1 (see masked_var)
        variance = variance * (count / (count - 1))
    whitened = (x - mean) * torch.rsqrt(variance + eps)
    return (whitened if shift_mean else whitened + mean).to(values.dtype)


def nonempty_rows(mask: torch.Tensor) -> torch.Tensor:
    """1 for each row with at least one selected token, else 0 (in the mask's dtype)."""
    return (mask.sum(dim=-1) > 0).to(mask.dtype)


def group_rows(index: Any, batch_size: int) -> Dict[Any, List[int]]:
    """Rows of each prompt group, in first-seen order.

    ``index`` (the ``uid`` of each row) may be a list, a numpy array or a tensor; tensor
    and numpy items are turned into plain Python values first, since tensors hash by
    identity and would put every row in a group of its own.
    """
    keys: Sequence = index.tolist() if hasattr(index, "tolist") else list(index)
    keys = [key.item() if isinstance(key, torch.Tensor) else key for key in keys]
    if len(keys) != batch_size:
        raise DataError(f"advantage index has {len(keys)} entries for {batch_size} rows")
    groups: Dict[Any, List[int]] = {}
    for row, key in enumerate(keys):
        groups.setdefault(key, []).append(row)
    return groups


def group_mean_std(scores: torch.Tensor, rows: List[int]) -> Tuple[torch.Tensor, torch.Tensor]:
    """Mean and unbiased std of ``scores[rows]``; a group of one has mean 0 and std 1
    (verl's convention: a lone sample keeps its own score as its advantage)."""
    if len(rows) == 1:
        return (torch.zeros((), dtype=scores.dtype, device=scores.device),
                torch.ones((), dtype=scores.dtype, device=scores.device))
    group = scores[rows]
    return group.mean(), group.std()
