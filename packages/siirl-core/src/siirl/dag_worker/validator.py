"""Validation: greedy rollout over the validation set, scored by the reward engine."""

from __future__ import annotations

from collections import defaultdict
from typing import Any, Dict

from siirl.data_coordinator.fields import DATA_SOURCE, RESPONSE_MASK, TOKEN_LEVEL_SCORES
from siirl.data_coordinator.protocol import get_non_tensor


def validate(worker: Any, val_loader: Any) -> Dict[str, float]:
    """``val/score/mean`` over every validation sample and ``val/<data_source>/score/mean``.

    Each worker validates its share of the set; the per-row results of all workers are
    combined, so the metrics are those of the whole set on any number of workers.
    """
    sync = getattr(worker, "sync_rollout_weights", None)
    if sync is not None:  # a resumed run may validate before its first step
        sync()
    rollout = worker.engines.get("rollout")
    reward = worker.engines.get("reward")
    rows = []  # (data_source, score, response length)
    batches = list(val_loader)
    comm = getattr(worker, "comm", None)
    if comm is not None and comm.active:
        # Generation gathers sharded weights (a collective): every worker must call it as
        # often as the others, so one whose share ran out repeats a discarded 1-row batch.
        most = max(comm.all_gather(len(batches)))
        for _ in range(most - len(batches) if batches else 0):
            rollout.generate(batches[0][:1], validate=True)
    for batch in batches:
        generated = rollout.generate(batch, validate=True).batch
        scored = reward.compute_reward(generated).batch
        scores = scored[TOKEN_LEVEL_SCORES].sum(dim=-1).tolist()
        lengths = scored[RESPONSE_MASK].sum(dim=-1).tolist()
        rows.extend(zip(get_non_tensor(scored, DATA_SOURCE), scores, lengths, strict=True))
    if comm is not None:
        # tensor-parallel peers validated copies of the same rows: count them once
        rows = rows if getattr(worker, "is_data_source", True) else []
        rows = [row for part in comm.all_gather(rows) for row in part]
    by_source: Dict[str, list] = defaultdict(list)
    for source, score, _ in rows:
        by_source[source].append(score)
    lengths = [length for _, _, length in rows]
    all_scores = [s for scores in by_source.values() for s in scores]
    if not all_scores:
        return {}
    metrics = {"val/score/mean": sum(all_scores) / len(all_scores),
               "val/response_length/mean": sum(lengths) / len(lengths)}
    for source, scores in by_source.items():
        metrics[f"val/{source}/score/mean"] = sum(scores) / len(scores)
    return metrics
