"""Validation: greedy rollout over the validation set, scored by the reward engine."""

from __future__ import annotations

from collections import defaultdict
from typing import Any, Dict

from siirl.data_coordinator.protocol import get_non_tensor


def validate(worker: Any, val_loader: Any) -> Dict[str, float]:
    """``val/score/mean`` over every validation sample and ``val/<data_source>/score/mean``."""
    rollout = worker.engines.get("rollout")
    reward = worker.engines.get("reward")
    by_source: Dict[str, list] = defaultdict(list)
    lengths = []
    for batch in val_loader:
        generated = rollout.generate(batch, validate=True).batch
        scored = reward.compute_reward(generated).batch
        scores = scored["token_level_scores"].sum(dim=-1).tolist()
        for source, score in zip(get_non_tensor(scored, "data_source"), scores, strict=True):
            by_source[source].append(score)
        lengths.extend(scored["response_mask"].sum(dim=-1).tolist())
    all_scores = [s for scores in by_source.values() for s in scores]
    if not all_scores:
        return {}
    metrics = {"val/score/mean": sum(all_scores) / len(all_scores),
               "val/response_length/mean": sum(lengths) / len(lengths)}
    for source, scores in by_source.items():
        metrics[f"val/{source}/score/mean"] = sum(scores) / len(scores)
    return metrics
