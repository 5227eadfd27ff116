"""Rule scores plus a reward model's: what a reward manager does when the batch carries
``rm_scores``.

With ``reward_model.enable=true`` the reward node first has the ``reward_model`` engine
write ``rm_scores`` (``[B, R]``, each row's score on its last response token, as verl), then
the reward manager scores the rules and adds the two per row::

    score = rule score + reward_model.rm_weight * reward-model score

A row whose ``data_source`` has no built-in rule (and no ``custom_reward_function``) is
scored by the reward model alone instead of stopping the run. Torch is only needed for the
tensors the manager already holds; the rest is plain lists.
"""

from __future__ import annotations

from typing import Any, Dict, List, Optional, Sequence, Tuple

import torch

from siirl.engine.reward_manager.outcome import Outcome, Scored
from siirl.engine.reward_score import SCORERS

RM_SCORES = "rm_scores"  # float32 [B, R]: the reward model's score on the last token (verl)


def rows_with_rules(manager: Any, data_sources: Sequence[Any]) -> Optional[List[bool]]:
    """Which rows a rule scores, when a reward model is on (None: it is off, every row
    must have a rule). A user's function scores every row; the built-in rules only the
    data sources they know."""
    if not manager.cfg.reward_model.enable:
        return None
    if not manager.is_default:
        return [True] * len(data_sources)
    return [str(source) in SCORERS for source in data_sources]


def only(rows: Sequence[Any], keep: Optional[Sequence[bool]]) -> List[Any]:
    """The rows to score with a rule."""
    return list(rows) if keep is None else [r for r, k in zip(rows, keep, strict=True) if k]


def expand(outcomes: Sequence[Outcome], keep: Optional[Sequence[bool]]) -> List[Outcome]:
    """One outcome per row again: rows without a rule score 0.0 from the rules."""
    if keep is None:
        return list(outcomes)
    found = iter(outcomes)
    return [next(found) if k else Scored(0.0) for k in keep]


def model_scores(batch: Any) -> Optional[torch.Tensor]:
    """Each row's reward-model score ``[B]`` (the sum of its ``rm_scores`` row), or None."""
    if RM_SCORES not in batch.keys():
        return None
    return batch.get(RM_SCORES).float().sum(dim=-1).cpu()


def add_model_scores(rule: List[float], keep: Optional[Sequence[bool]], model: torch.Tensor,
                     weight: float) -> Tuple[List[float], Dict[str, float]]:
    """``rule + weight * model`` per row, and ``reward/rule/mean`` over the rows a rule
    scored (0.0 when none)."""
    keep = list(keep) if keep is not None else [True] * len(rule)
    ruled = [s for s, k in zip(rule, keep, strict=True) if k]
    combined = [r + weight * m for r, m in zip(rule, model.tolist(), strict=True)]
    return combined, {"reward/rule/mean": sum(ruled) / len(ruled) if ruled else 0.0}


def place_on_last_token(scores: torch.Tensor, response_mask: torch.Tensor) -> torch.Tensor:
    """``[B, R]`` with each row's score on its last response token (the last column for a
    row without one), as the rule scores are placed."""
    out = torch.zeros(response_mask.shape, dtype=torch.float32)
    if out.numel():
        mask = response_mask.cpu() > 0
        last = mask.shape[1] - 1 - mask.flip(1).to(torch.int8).argmax(dim=1)
        out[torch.arange(out.shape[0]), last] = scores.float().cpu()
    return out


def score_metrics(scores: torch.Tensor) -> Dict[str, float]:
    """``reward/rm/mean`` and ``reward/rm/std`` of the raw (unweighted) model scores."""
    if not scores.numel():
        return {"reward/rm/mean": 0.0, "reward/rm/std": 0.0}
    std = scores.float().std(unbiased=False).item()
    return {"reward/rm/mean": scores.float().mean().item(), "reward/rm/std": std}
