"""Keep or drop whole prompt groups (rows sharing a ``uid``) by a per-row value."""

from __future__ import annotations

from typing import Any, Callable, Dict, List, Tuple

import torch

from siirl.data_coordinator.fields import SCORE, TOKEN_LEVEL_REWARDS, TOKEN_LEVEL_SCORES
from siirl.data_coordinator.protocol import get_non_tensor, group_indices, select_rows
from siirl.errors import DataError


def row_values(batch: Any, metric: str) -> torch.Tensor:
    """Per-row float values of ``metric``.

    ``seq_reward`` sums ``token_level_scores``, ``seq_final_reward`` sums
    ``token_level_rewards``; ``score`` is the scorer's own score column (before reward
    shaping such as the overlong buffer; ``token_level_scores`` when there is none); any
    other name (e.g. ``acc``) is read from the batch field of that name (a tensor, summed
    over its trailing dims, or a non-tensor list of numbers).
    """
    aliases = {"seq_reward": TOKEN_LEVEL_SCORES, "seq_final_reward": TOKEN_LEVEL_REWARDS}
    if metric == SCORE and SCORE not in batch.keys():
        aliases[SCORE] = TOKEN_LEVEL_SCORES
    key = aliases.get(metric, metric)
    if key not in batch.keys():
        raise DataError(f"group filter metric '{metric}' needs batch field '{key}', which is "
                        f"absent (fields: {', '.join(sorted(batch.keys()))})")
    value = batch.get(key)
    if isinstance(value, torch.Tensor):
        value = value.float()
        return value.reshape(value.shape[0], -1).sum(dim=1)
    return torch.tensor([float(v) for v in get_non_tensor(batch, key)])


def filter_groups(batch: Any, values: torch.Tensor,
                  keep: Callable[[torch.Tensor], bool]) -> Tuple[Any, Dict[str, float]]:
    """Keep the rows of every group for which ``keep(group_values)`` is true."""
    groups = group_indices(batch)
    kept_rows: List[int] = []
    kept = 0
    for rows in groups.values():
        if keep(values[rows]):
            kept_rows.extend(rows)
            kept += 1
    total = max(len(groups), 1)
    metrics = {"groups/total": float(len(groups)), "groups/kept": float(kept),
               "groups/kept_ratio": kept / total}
    return select_rows(batch, kept_rows), metrics
