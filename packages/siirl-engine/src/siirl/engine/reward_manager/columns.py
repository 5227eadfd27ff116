"""Where scores go: token-level score tensors, extra result columns, score metrics."""

from __future__ import annotations

import logging
from typing import Any, Dict, List

import torch

logger = logging.getLogger(__name__)


def token_level(rewards: List[float], responses: torch.Tensor, mask: torch.Tensor
                ) -> torch.Tensor:
    """Each row's reward at its last valid response token, zeros elsewhere."""
    token_scores = torch.zeros(responses.shape, dtype=torch.float32)
    if responses.shape[0] and responses.shape[1]:
        # Last position whose mask is 1 (flip + argmax); an all-zero row gets the last
        # position, as in verl, so its score still counts in sequence sums.
        last = mask.shape[1] - 1 - (mask.flip(1) > 0).to(torch.int8).argmax(dim=1)
        token_scores[torch.arange(len(rewards)), last.cpu()] = torch.tensor(rewards)
    return token_scores.to(responses.device)


def extra_columns(extras: List[Dict[str, Any]], reserved: set) -> Dict[str, list]:
    """Per-row columns for the extra keys of dict results.

    A row without a key (a failed row, or a scorer that returns it only sometimes) gets
    the "false" value of the key's type (False / 0 / 0.0), else None, so columns such as
    ``acc`` stay numeric for filters and metrics. Keys naming existing batch fields are
    dropped, never overwritten.
    """
    keys: List[str] = []
    for row in extras:
        keys.extend(k for k in row if k not in keys)
    columns: Dict[str, list] = {}
    for key in keys:
        if key in reserved:
            logger.warning("reward result key %r names an existing batch field; ignored", key)
            continue
        sample = next(row[key] for row in extras if key in row)
        fill = type(sample)() if isinstance(sample, (bool, int, float)) else None
        columns[key] = [row.get(key, fill) for row in extras]
    return columns


def score_metrics(scores: List[float], token_scores: torch.Tensor,
                  data_sources: list) -> Dict[str, float]:
    if not scores:
        return {}
    t = torch.tensor(scores, dtype=torch.float32)
    metrics = {
        "critic/score/mean": t.mean().item(),
        "critic/score/max": t.max().item(),
        "critic/score/min": t.min().item(),
        "critic/rewards/mean": token_scores.sum(dim=-1).mean().item(),
    }
    by_source: Dict[str, List[float]] = {}
    for source, score in zip(data_sources, scores, strict=True):
        by_source.setdefault(str(source), []).append(score)
    for source, values in by_source.items():
        metrics[f"reward/{source}/mean"] = sum(values) / len(values)
    return metrics
